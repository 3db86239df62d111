package inspect

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kube-proxy/proxy"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/nftables"
)

// TraceReport is trace's result, as --json prints it.
type TraceReport struct {
	Packet   string    `json:"packet"`
	Service  string    `json:"service,omitempty"`
	Walks    []Walk    `json:"walks"`
	Reaches  bool      `json:"reaches"`
	API      *APIView  `json:"api,omitempty"`
	Problems []string  `json:"problems,omitempty"`
	Modes    []string  `json:"modes"`
	Time     time.Time `json:"time"`
}

// APIView is the API's side of a traced Service.
type APIView struct {
	Service   string            `json:"service"`
	Type      string            `json:"type"`
	ClusterIP string            `json:"clusterIP"`
	Ports     []string          `json:"ports"`
	Policies  string            `json:"policies"`
	Endpoints []EndpointView    `json:"endpoints"`
	Disagrees []string          `json:"disagrees,omitempty"`
	Error     string            `json:"error,omitempty"`
	Extra     map[string]string `json:"extra,omitempty"`
}

// EndpointView is one endpoint of an EndpointSlice.
type EndpointView struct {
	Address     string `json:"address"`
	Ready       bool   `json:"ready"`
	Serving     bool   `json:"serving"`
	Terminating bool   `json:"terminating"`
	Node        string `json:"node,omitempty"`
	Zone        string `json:"zone,omitempty"`
	Hints       string `json:"hints,omitempty"`
	Slice       string `json:"slice"`
}

func runTrace(ctx context.Context, env *Env, args []string, to, from, in string, local bool, out *printer, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "kube-proxy trace: "+format+"\n", a...)
		return exitUsage
	}
	if (len(args) == 1) == (to != "") || len(args) > 1 {
		return fail("give either NAMESPACE/SERVICE[:PORT] or --to IP:PORT[/PROTO] (see --help)")
	}
	if in != "" && local {
		return fail("--in and --local exclude each other")
	}
	live, err := ReadLive(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "kube-proxy trace:", err)
		return exitFinding
	}
	rep := &TraceReport{Modes: live.Modes(), Problems: live.Problems, Time: time.Now().UTC()}
	var pkt Packet
	if to != "" {
		pkt.Dst, pkt.Port, pkt.Protocol, err = parseTo(to)
		if err != nil {
			return fail("--to: %v", err)
		}
	} else {
		rep.Service = args[0]
		pkt.Dst, pkt.Port, pkt.Protocol, err = resolveService(ctx, env, live, args[0])
		if err != nil {
			fmt.Fprintln(stderr, "kube-proxy trace:", err)
			return exitFinding
		}
	}
	if err := completePacket(&pkt, from, in, local, live); err != nil {
		return fail("%v", err)
	}
	rep.Packet = pkt.String()
	rep.Walks, err = live.Trace(pkt)
	if err != nil {
		fmt.Fprintln(stderr, "kube-proxy trace:", err)
		return exitFinding
	}
	rep.Reaches = len(rep.Walks) > 0
	for _, w := range rep.Walks {
		rep.Reaches = rep.Reaches && w.Reaches()
	}
	if svc := rep.Service; svc != "" || env.Config.ClientConnection.Kubeconfig != "" {
		rep.API = apiView(ctx, env, svc, pkt, rep.Walks)
	}
	printTrace(out, rep)
	out.emit(rep)
	if rep.Reaches {
		return exitOK
	}
	return exitFinding
}

// parseTo parses IP:PORT[/PROTO].
func parseTo(s string) (netip.Addr, uint16, string, error) {
	proto := "tcp"
	if i := strings.LastIndex(s, "/"); i >= 0 {
		proto, s = strings.ToLower(s[i+1:]), s[:i]
	}
	if proto != "tcp" && proto != "udp" && proto != "sctp" {
		return netip.Addr{}, 0, "", fmt.Errorf("protocol %q: must be tcp, udp or sctp", proto)
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.Addr{}, 0, "", fmt.Errorf("%q is not IP:PORT ([IPv6]:PORT for IPv6)", s)
	}
	return ap.Addr().Unmap(), ap.Port(), proto, nil
}

// completePacket fills in the source and the interface.
func completePacket(pkt *Packet, from, in string, local bool, live *Live) error {
	pkt.Local, pkt.In = local, in
	if from != "" {
		a, err := netip.ParseAddr(from)
		if err != nil {
			return fmt.Errorf("--from %q is not an IP address", from)
		}
		pkt.Src = a.Unmap()
	}
	if pkt.Src.IsValid() && pkt.Src.Is4() != pkt.Dst.Is4() {
		return fmt.Errorf("--from %s and the destination %s are of different IP families", pkt.Src, pkt.Dst)
	}
	if local {
		if !pkt.Src.IsValid() {
			pkt.Src = nodeSource(pkt.Dst, live.Addrs)
		}
		return nil
	}
	if pkt.In == "" {
		pkt.In = defaultRouteInterface(pkt.Family())
	}
	if !pkt.Src.IsValid() {
		pkt.Src = netip.MustParseAddr("203.0.113.1")
		if pkt.Dst.Is6() {
			pkt.Src = netip.MustParseAddr("2001:db8::1")
		}
	}
	return nil
}

// nodeSource picks the source a local process would use: loopback for loopback, else the node's first
// non-loopback address of the family.
func nodeSource(dst netip.Addr, addrs []netip.Addr) netip.Addr {
	if dst.IsLoopback() {
		return dst
	}
	for _, a := range addrs {
		if a.Is4() == dst.Is4() && !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			return a
		}
	}
	if dst.Is4() {
		return netip.MustParseAddr("127.0.0.1")
	}
	return netip.IPv6Loopback()
}

// defaultRouteInterface returns the interface of the family's default route ("eth0" when unknown).
func defaultRouteInterface(family v1.IPFamily) string {
	if family == v1.IPv4Protocol {
		if b, err := os.ReadFile("/proc/net/route"); err == nil {
			for _, line := range strings.Split(string(b), "\n")[1:] {
				f := strings.Fields(line)
				if len(f) > 2 && f[1] == "00000000" && f[2] != "" {
					return f[0]
				}
			}
		}
	} else if b, err := os.ReadFile("/proc/net/ipv6_route"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 10 && f[0] == strings.Repeat("0", 32) && f[1] == "00" && f[9] != "lo" {
				return f[9]
			}
		}
	}
	return "eth0"
}

// resolveService finds a Service port's ClusterIP: from the API when it answers, else from the rules'
// comments.
func resolveService(ctx context.Context, env *Env, live *Live, ref string) (netip.Addr, uint16, string, error) {
	nsName, portName, _ := strings.Cut(ref, ":")
	ns, name, ok := strings.Cut(nsName, "/")
	if !ok || ns == "" || name == "" {
		return netip.Addr{}, 0, "", fmt.Errorf("%q: want NAMESPACE/NAME[:PORT]", ref)
	}
	if client, err := env.client(); err == nil {
		// An API that does not answer leaves the rules' comments: the API may be down, which is when
		// trace is needed most.
		if svc, err := getService(ctx, client, ns, name); err == nil {
			if svc == nil {
				return netip.Addr{}, 0, "", fmt.Errorf("service %s: not found in the API", nsName)
			}
			return servicePort(svc, portName)
		}
	}
	for _, x := range live.XTables {
		for _, r := range x.Tables.Rules("nat", "KUBE-SERVICES") {
			if a, p, proto, ok := ruleService(r, nsName, portName); ok {
				return a, p, proto, nil
			}
		}
		// A Service chain's masquerade rule carries the same comment (KUBE-SERVICES' rule may be gone).
		for _, c := range x.Tables.Chains("nat") {
			if !strings.HasPrefix(c, iptables.PrefixService) {
				continue
			}
			for _, r := range x.Tables.Rules("nat", c) {
				if a, p, proto, ok := ruleService(r, nsName, portName); ok {
					return a, p, proto, nil
				}
			}
		}
	}
	for _, f := range live.NFTFamilies {
		for _, e := range nftables.ServiceElements(live.NFT, f) {
			if e.ClusterIP && svcMatches(e.Service, nsName, portName) {
				return e.Addr, e.Port, e.Protocol, nil
			}
		}
	}
	return netip.Addr{}, 0, "", fmt.Errorf("service %s: not in the API (unreachable) nor in the kernel's rules", ref)
}

// svcMatches reports whether a Service port name from the rules ("ns/name:port" or "ns/name") is nsName
// with port portName ("" for any).
func svcMatches(s, nsName, portName string) bool {
	base, port, _ := strings.Cut(s, ":")
	return base == nsName && (portName == "" || port == portName)
}

// ruleService reads a "ns/name:port cluster IP" rule.
func ruleService(r, nsName, portName string) (netip.Addr, uint16, string, bool) {
	c := comment(r)
	svc, ok := iptables.ClusterIPRuleService(c)
	if !ok {
		return netip.Addr{}, 0, "", false
	}
	base, port, _ := strings.Cut(svc, ":")
	if base != nsName || (portName != "" && port != portName) {
		return netip.Addr{}, 0, "", false
	}
	words, err := splitWords(r)
	if err != nil {
		return netip.Addr{}, 0, "", false
	}
	var a netip.Addr
	var p int
	proto := ""
	for i := 0; i+1 < len(words); i++ {
		switch words[i] {
		case "-d":
			a, _ = netip.ParseAddr(strings.Split(words[i+1], "/")[0])
		case "--dport":
			p, _ = strconv.Atoi(words[i+1])
		case "-p":
			proto = words[i+1]
		}
	}
	return a, uint16(p), proto, a.IsValid() && p > 0
}

// servicePort picks a Service's port by name (the only one when portName is "").
func servicePort(svc *v1.Service, portName string) (netip.Addr, uint16, string, error) {
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == v1.ClusterIPNone {
		return netip.Addr{}, 0, "", fmt.Errorf("service %s/%s has no ClusterIP (headless or ExternalName): kube-proxy does not proxy it", svc.Namespace, svc.Name)
	}
	a, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return netip.Addr{}, 0, "", err
	}
	var names []string
	for _, p := range svc.Spec.Ports {
		names = append(names, fmt.Sprintf("%s(%d/%s)", p.Name, p.Port, p.Protocol))
		if p.Name == portName || (portName == "" && len(svc.Spec.Ports) == 1) || portName == strconv.Itoa(int(p.Port)) {
			return a, uint16(p.Port), strings.ToLower(string(p.Protocol)), nil
		}
	}
	return netip.Addr{}, 0, "", fmt.Errorf("service %s/%s: name a port (%s), e.g. %s/%s:%s", svc.Namespace, svc.Name, strings.Join(names, ", "), svc.Namespace, svc.Name, svc.Spec.Ports[0].Name)
}

// apiView fetches the Service the packet goes to (named, or found by its address) and its endpoints,
// and says where the kernel's walk disagrees with them.
func apiView(ctx context.Context, env *Env, ref string, pkt Packet, walks []Walk) *APIView {
	client, err := env.client()
	if err != nil {
		return nil
	}
	var svc *v1.Service
	if ref != "" {
		nsName, _, _ := strings.Cut(ref, ":")
		ns, name, _ := strings.Cut(nsName, "/")
		svc, err = getService(ctx, client, ns, name)
	} else {
		svc, err = findService(ctx, client, pkt)
	}
	if err != nil {
		return &APIView{Error: err.Error()}
	}
	if svc == nil {
		return &APIView{Error: fmt.Sprintf("no Service in the API has %s port %d on %s", pkt.Protocol, pkt.Port, pkt.Dst)}
	}
	v := &APIView{Service: svc.Namespace + "/" + svc.Name, Type: string(svc.Spec.Type), ClusterIP: svc.Spec.ClusterIP,
		Policies: fmt.Sprintf("externalTrafficPolicy=%s internalTrafficPolicy=%s sessionAffinity=%s", svc.Spec.ExternalTrafficPolicy, derefPolicy(svc.Spec.InternalTrafficPolicy), svc.Spec.SessionAffinity)}
	var port *v1.ServicePort
	for i, p := range svc.Spec.Ports {
		v.Ports = append(v.Ports, fmt.Sprintf("%s %d/%s -> %s nodePort=%d", p.Name, p.Port, p.Protocol, p.TargetPort.String(), p.NodePort))
		if strings.EqualFold(string(p.Protocol), pkt.Protocol) && (int(p.Port) == int(pkt.Port) || int(p.NodePort) == int(pkt.Port)) {
			port = &svc.Spec.Ports[i]
		}
	}
	slices, err := client.ListEndpointSlices(ctx, svc.Namespace, metav1.ListOptions{LabelSelector: discovery.LabelServiceName + "=" + svc.Name})
	if err != nil {
		v.Error = "listing EndpointSlices: " + err.Error()
		return v
	}
	ready := map[string]bool{}
	for _, s := range slices.Items {
		var targetPort int32
		for _, p := range s.Ports {
			if port != nil && p.Name != nil && *p.Name == port.Name && p.Port != nil {
				targetPort = *p.Port
			}
		}
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				ev := EndpointView{Address: a, Ready: e.Conditions.Ready == nil || *e.Conditions.Ready,
					Serving: e.Conditions.Serving == nil || *e.Conditions.Serving, Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating, Slice: s.Name}
				if targetPort > 0 {
					ev.Address = netip.AddrPortFrom(netip.MustParseAddr(a), uint16(targetPort)).String()
				}
				if e.NodeName != nil {
					ev.Node = *e.NodeName
				}
				if e.Zone != nil {
					ev.Zone = *e.Zone
				}
				if e.Hints != nil {
					var zs []string
					for _, z := range e.Hints.ForZones {
						zs = append(zs, z.Name)
					}
					ev.Hints = "zones=" + strings.Join(zs, ",")
				}
				if ev.Ready {
					ready[ev.Address] = true
				}
				v.Endpoints = append(v.Endpoints, ev)
			}
		}
	}
	if port == nil {
		v.Disagrees = append(v.Disagrees, fmt.Sprintf("the Service has no %s port %d", pkt.Protocol, pkt.Port))
		return v
	}
	for _, w := range walks {
		for _, o := range w.Outcomes {
			if o.Endpoint != "" && !o.Proxy && !ready[o.Endpoint] {
				v.Disagrees = append(v.Disagrees, fmt.Sprintf("%s sends packets to %s, which is not a ready endpoint in the API", w.Dataplane, o.Endpoint))
			}
		}
		if !w.Reaches() && len(ready) > 0 {
			v.Disagrees = append(v.Disagrees, fmt.Sprintf("the API has %d ready endpoints but %s does not deliver this packet to one (a traffic policy, a source range, or stale rules: see `kube-proxy diff`)", len(ready), w.Dataplane))
		}
	}
	return v
}

// getService gets a Service by listing it by name: kube-proxy's role (system:node-proxier) may list and
// watch Services but not get them. nil when there is none.
func getService(ctx context.Context, client proxy.API, ns, name string) (*v1.Service, error) {
	list, err := client.ListServices(ctx, ns, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return nil, err
	}
	if len(list.Items) == 0 {
		return nil, nil
	}
	return &list.Items[0], nil
}

func derefPolicy(p *v1.ServiceInternalTrafficPolicy) string {
	if p == nil {
		return "Cluster"
	}
	return string(*p)
}

// findService finds the Service whose ClusterIP, externalIPs, LoadBalancer IPs or NodePort the packet is
// addressed to.
func findService(ctx context.Context, client proxy.API, pkt Packet) (*v1.Service, error) {
	list, err := client.ListServices(ctx, "", metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	dst := pkt.Dst.String()
	for i := range list.Items {
		s := &list.Items[i]
		ips := append(append([]string{}, s.Spec.ClusterIPs...), s.Spec.ExternalIPs...)
		for _, in := range s.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		for _, p := range s.Spec.Ports {
			if !strings.EqualFold(string(p.Protocol), pkt.Protocol) {
				continue
			}
			for _, ip := range ips {
				if ip == dst && int(p.Port) == int(pkt.Port) {
					return s, nil
				}
			}
			if p.NodePort != 0 && int(p.NodePort) == int(pkt.Port) {
				return s, nil
			}
		}
	}
	return nil, nil
}

func printTrace(out *printer, rep *TraceReport) {
	out.printf("Packet: %s\n", rep.Packet)
	out.printf("Rules on this node: %s\n", orNone(strings.Join(rep.Modes, ", ")))
	for _, p := range rep.Problems {
		out.printf("  (could not read: %s)\n", p)
	}
	if len(rep.Walks) == 0 {
		out.printf("\nNo kube-proxy rules for this address family on this node: nothing redirects the packet.\n")
	}
	for _, w := range rep.Walks {
		out.printf("\n%s:\n", w.Dataplane)
		for _, o := range w.Outcomes {
			verdict := o.Verdict
			if o.Verdict == "ACCEPT" && o.Endpoint != "" {
				verdict = "-> " + o.Endpoint
			}
			out.printf("  %-24s p=%.4f  %s\n", verdict, o.Probability, o.Reason)
		}
		if len(w.Outcomes) > 0 {
			out.printf("  rules matched (most likely outcome):\n")
			for _, r := range w.Outcomes[0].Rules {
				out.printf("    %s\n", r)
			}
		}
		if len(w.Nearest) > 0 {
			out.printf("  Services on this address or port: %s\n", strings.Join(w.Nearest, "; "))
		}
		for _, warn := range w.Warnings {
			out.printf("  warning: %s\n", warn)
		}
	}
	if a := rep.API; a != nil {
		out.printf("\nAPI:\n")
		if a.Service != "" {
			out.printf("  Service %s (%s, ClusterIP %s, %s)\n", a.Service, a.Type, a.ClusterIP, a.Policies)
			for _, p := range a.Ports {
				out.printf("    port %s\n", p)
			}
			for _, e := range a.Endpoints {
				out.printf("    endpoint %-22s ready=%-5v serving=%-5v terminating=%-5v node=%s zone=%s %s (slice %s)\n", e.Address, e.Ready, e.Serving, e.Terminating, e.Node, e.Zone, e.Hints, e.Slice)
			}
			if len(a.Endpoints) == 0 {
				out.printf("    no endpoints\n")
			}
		}
		if a.Error != "" {
			out.printf("  %s\n", a.Error)
		}
		for _, d := range a.Disagrees {
			out.printf("  DISAGREES: %s\n", d)
		}
		if a.Service != "" && len(a.Disagrees) == 0 {
			out.printf("  The kernel's rules agree with the API.\n")
		}
	}
	if rep.Reaches {
		out.printf("\nVerdict: reaches an endpoint.\n")
	} else {
		out.printf("\nVerdict: does NOT reach an endpoint.\n")
	}
}
