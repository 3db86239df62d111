package inspect

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kube-proxy/e2e/harness"
)

// bed is one test's world and the daemon in it.
type bed struct {
	*harness.Bed
	mode string
	xt   *harness.XTables
	d    *harness.Daemon
	bin  string
}

func newBed(t *testing.T, mode string) *bed {
	t.Helper()
	tools := []string{"iptables-nft", "iptables-legacy", "iptables-nft-save", "iptables-legacy-save", "nft", "conntrack"}
	b := &bed{mode: mode, Bed: harness.NewBed(t, harness.BedOptions{Pods: 3, Prefix: "insp", Tools: tools})}
	bin, err := harness.DaemonBinary()
	if err != nil {
		t.Fatal(err)
	}
	b.bin = bin
	xt, err := harness.NewXTables(b.Topo.Node, harness.BackendNFT, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b.xt = xt
	if mode == "iptables" || mode == "userspace" {
		ctx, cancel := b.Ctx()
		defer cancel()
		if err := xt.SetHint(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// start starts the daemon: no periodic full sync during the test, so what a test breaks stays broken
// until it restarts the daemon.
func (b *bed) start(t *testing.T) {
	t.Helper()
	section := b.mode
	if section == "userspace" { // its capture rules are iptables rules, synced as mode iptables'
		section = "iptables"
	}
	cfg := fmt.Sprintf("mode: %s\nclusterCIDR: %s\n%s:\n  syncPeriod: 1h\n  minSyncPeriod: 0s\n", b.mode, harness.PodCIDR, section)
	b.d = harness.StartDaemon(t, b.Cluster, b.Topo.Node, harness.DaemonOptions{NodeName: b.Node, Config: cfg,
		Env: []string{b.xt.Env()}, Kubeconfig: b.Kubeconfig})
}

// cmd runs `kube-proxy ARGS --config <the daemon's>` in the node namespace and returns stdout and the
// exit code.
func (b *bed) cmd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := b.Topo.Node.Command(ctx, b.bin, append(args, "--config="+b.d.ConfigPath)...)
	c.Env = append(os.Environ(), b.xt.Env())
	var stdout, stderr strings.Builder
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("kube-proxy %s: %v", strings.Join(args, " "), err)
	}
	if stderr.Len() > 0 {
		t.Logf("kube-proxy %s stderr: %s", args[0], strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), code
}

// sh runs a command in the node namespace.
func (b *bed) sh(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := b.Topo.Node.Command(ctx, args[0], args[1:]...)
	c.Env = append(os.Environ(), b.xt.Env())
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

type traceJSON struct {
	Packet  string `json:"packet"`
	Reaches bool   `json:"reaches"`
	Walks   []struct {
		Dataplane string `json:"dataplane"`
		Outcomes  []struct {
			Verdict    string   `json:"verdict"`
			Endpoint   string   `json:"endpoint"`
			Masquerade bool     `json:"masquerade"`
			Reason     string   `json:"reason"`
			Rules      []string `json:"rules"`
		} `json:"outcomes"`
	} `json:"walks"`
	API *struct {
		Service   string   `json:"service"`
		Disagrees []string `json:"disagrees"`
	} `json:"api"`
}

func (b *bed) trace(t *testing.T, args ...string) (traceJSON, int) {
	t.Helper()
	out, code := b.cmd(t, append([]string{"trace", "--json"}, args...)...)
	var tr traceJSON
	if err := json.Unmarshal([]byte(out), &tr); err != nil {
		t.Fatalf("trace %v: %v:\n%s", args, err, out)
	}
	return tr, code
}

// endpoints returns the pods (by name) the trace's outcomes reach, and the verdicts and reasons.
func ptr[T any](v T) *T { return &v }

func (tr traceJSON) pods() (pods []string, verdicts []string, masq []bool, reasons []string) {
	for _, w := range tr.Walks {
		for _, o := range w.Outcomes {
			verdicts = append(verdicts, o.Verdict)
			reasons = append(reasons, o.Reason)
			masq = append(masq, o.Masquerade)
			if o.Endpoint != "" {
				for i := 1; i <= 3; i++ {
					if strings.HasPrefix(o.Endpoint, harness.PodIP(i)+":") {
						pods = append(pods, fmt.Sprintf("pod%d", i))
					}
				}
			}
		}
	}
	sort.Strings(pods)
	return slices.Compact(pods), verdicts, masq, reasons
}

// TestTraceAgreesWithTraffic: for each case, trace's verdict and endpoints are what real connections,
// sent the same way, get.
func TestTraceAgreesWithTraffic(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables", "userspace"} {
		t.Run(mode, func(t *testing.T) { traceCases(t, mode) })
	}
}

func traceCases(t *testing.T, mode string) {
	b := newBed(t, mode)
	web := b.CreateService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	empty := b.CreateService(t, "empty", nil)
	remote := b.CreateService(t, "remote", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	b.SetEndpoints(t, "remote", harness.RemoteEndpoint(2), harness.RemoteEndpoint(3))
	const lbIP = "192.0.2.77"
	fw := b.CreateService(t, "fw", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24"}
	})
	fw.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
	ctx, cancel := b.Ctx()
	defer cancel()
	if _, err := b.Cluster.Admin.CoreV1().Services(b.NS).UpdateStatus(ctx, fw, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.SetEndpoints(t, "fw", harness.ReadyEndpoint(1))
	b.CreateService(t, "ext", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.88"} })
	b.SetEndpoints(t, "ext", harness.ReadyEndpoint(2))
	// The client reaches the LB IP and the external IP through the node; the node routes them on (as a
	// default route would), so that a packet no rule takes is dropped where the rules say, not refused
	// by routing first.
	for _, ip := range []string{lbIP, "192.0.2.88"} {
		if _, err := b.Topo.Client.IP(ctx, "route", "replace", ip+"/32", "via", harness.NodeIP); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Topo.Node.IP(ctx, "route", "replace", "192.0.2.0/24", "via", harness.ClientIP); err != nil {
		t.Fatal(err)
	}
	sticky := b.CreateService(t, "sticky", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP })
	b.SetEndpoints(t, "sticky", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	itp := b.CreateService(t, "itp", func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal) })
	b.SetEndpoints(t, "itp", harness.ReadyEndpoint(2), harness.RemoteEndpoint(3))
	b.start(t)
	tcpNP := harness.NodePortOf(t, web, "tcp")
	client, node := b.Topo.Client, b.Topo.Node
	out, _ := b.cmd(t, "trace", "--to", harness.HostPort(harness.NodeIP, tcpNP), "--from", harness.ClientIP, "--in", "eth0")
	t.Logf("kube-proxy trace --to NodeIP:NodePort:\n%s", out)
	for _, c := range []struct {
		name      string
		from      *harness.NetNS
		network   string
		addr      string
		args      []string // trace's packet
		wantPods  []string
		wantFail  string // the traffic's error class when it must fail ("any": any error)
		reasonHas string
	}{
		{"ClusterIP from the node", node, "tcp", harness.HostPort(web.Spec.ClusterIP, harness.ServiceTCPPort),
			[]string{"--local"}, []string{"pod1", "pod2", "pod3"}, "", "DNAT to endpoint"},
		{"NodePort from the client", client, "tcp", harness.HostPort(harness.NodeIP, tcpNP),
			[]string{"--from", harness.ClientIP, "--in", "eth0"}, []string{"pod1", "pod2", "pod3"}, "", "masqueraded"},
		{"Service by name (UDP port) from the client", client, "udp", harness.HostPort(web.Spec.ClusterIP, harness.ServiceUDPPort),
			[]string{b.NS + "/web:udp", "--from", harness.ClientIP, "--in", "eth0"}, []string{"pod1", "pod2", "pod3"}, "", "DNAT"},
		{"ClusterIP from a pod (not masqueraded)", b.Topo.Pods[0].NS, "tcp", harness.HostPort(web.Spec.ClusterIP, harness.ServiceTCPPort),
			[]string{"--from", harness.PodIP(1), "--in", b.Topo.Pods[0].NodeLink}, []string{"pod1", "pod2", "pod3"}, "", "source address kept"},
		{"internalTrafficPolicy Local from a pod", b.Topo.Pods[0].NS, "tcp", harness.HostPort(itp.Spec.ClusterIP, harness.ServiceTCPPort),
			[]string{"--from", harness.PodIP(1), "--in", b.Topo.Pods[0].NodeLink}, []string{"pod2"}, "", "DNAT"},
		{"externalIP", client, "tcp", harness.HostPort("192.0.2.88", harness.ServiceTCPPort),
			[]string{"--from", harness.ClientIP, "--in", "eth0"}, []string{"pod2"}, "", "DNAT"},
		{"no endpoints", client, "tcp", harness.HostPort(empty.Spec.ClusterIP, harness.ServiceTCPPort),
			[]string{"--from", harness.ClientIP, "--in", "eth0"}, nil, "refused", "no ready endpoints"},
		{"Local policy without a local endpoint", client, "tcp", harness.HostPort(harness.NodeIP, harness.NodePortOf(t, remote, "tcp")),
			[]string{"--from", harness.ClientIP, "--in", "eth0"}, nil, "timeout", "traffic policy is Local"},
		{"source outside loadBalancerSourceRanges", client, "tcp", harness.HostPort(lbIP, harness.ServiceTCPPort),
			[]string{"--from", harness.ClientIP, "--in", "eth0"}, nil, "timeout", "loadBalancerSourceRanges"},
		// Mode iptables has no rule for it (the packet is routed on untouched, and nothing answers);
		// mode nftables rejects it, as upstream.
		{"unknown port on a ClusterIP", client, "tcp", harness.HostPort(web.Spec.ClusterIP, 81),
			[]string{"--from", harness.ClientIP, "--in", "eth0"}, nil, "any", map[string]string{
				"iptables": "no kube-proxy rule matched", "userspace": "no kube-proxy rule matched",
				"nftables": "no Service serves tcp port 81"}[mode]},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{}, c.args...)
			if !strings.Contains(strings.Join(args, " "), "/web:") {
				args = append(args, "--to", c.addr+"/"+c.network)
			}
			tr, code := b.trace(t, args...)
			pods, verdicts, masq, reasons := tr.pods()
			res := harness.HitForTest(t, c.from, c.network, c.addr, 20, harness.HitOptions{Timeout: time.Second})
			counts := harness.CountHits(res)
			var hit []string
			for k := range counts {
				hit = append(hit, k)
			}
			sort.Strings(hit)
			t.Logf("%s: trace %v %v %v; traffic %s", tr.Packet, verdicts, pods, masq, harness.FormatHits(counts))
			if mode == "userspace" && c.wantFail == "" {
				// The rules send the packet to the daemon's own proxy, which picks the pod: the trace
				// names the listener, the traffic the pods.
				if code != 0 || !tr.Reaches || len(pods) > 0 {
					t.Errorf("trace: exit %d reaches=%v pods %v, want 0, true, the daemon's listener", code, tr.Reaches, pods)
				}
				if !slices.Equal(hit, c.wantPods) {
					t.Errorf("traffic reached %v, want %v", hit, c.wantPods)
				}
			} else if c.wantFail == "" {
				if code != 0 || !tr.Reaches || !slices.Equal(pods, c.wantPods) {
					t.Errorf("trace: exit %d reaches=%v pods %v, want 0, true, %v", code, tr.Reaches, pods, c.wantPods)
				}
				if !slices.Equal(hit, c.wantPods) {
					t.Errorf("traffic reached %v, trace said %v", hit, pods)
				}
			} else {
				if code != 1 || tr.Reaches || len(pods) > 0 {
					t.Errorf("trace: exit %d reaches=%v pods %v, want 1, false, none", code, tr.Reaches, pods)
				}
				if c.wantFail == "any" {
					for _, h := range hit {
						if !strings.HasPrefix(h, "ERR:") {
							t.Errorf("traffic: %s, want every connection to fail", harness.FormatHits(counts))
						}
					}
				} else if c.wantFail == "refused" {
					// A REJECT's ICMP error is rate-limited by the kernel (icmp_ratelimit, icmp_msgs_per_sec): a
					// connection whose error was not sent times out instead. None may get through, and most
					// must be refused.
					total := 0
					for _, h := range hit {
						total += counts[h]
						if h != "ERR:refused" && h != "ERR:timeout" {
							t.Errorf("traffic: %s, want every connection refused (or, its ICMP error rate-limited, timed out)", harness.FormatHits(counts))
						}
					}
					if counts["ERR:refused"]*2 <= total {
						t.Errorf("traffic: %s, want most connections refused", harness.FormatHits(counts))
					}
				} else if len(hit) != 1 || hit[0] != "ERR:"+c.wantFail {
					t.Errorf("traffic: %s, want every connection to fail with %s", harness.FormatHits(counts), c.wantFail)
				}
			}
			if mode == "userspace" && c.wantFail == "" {
				c.reasonHas = "REDIRECTed to the daemon's own proxy"
				if c.from == client && !strings.Contains(strings.Join(reasons, ""), "proxy at "+harness.NodeIP+":") {
					t.Errorf("reasons %q: want the listener on the incoming interface's address %s", reasons, harness.NodeIP)
				}
			}
			if !strings.Contains(strings.Join(reasons, "\n"), c.reasonHas) {
				t.Errorf("reasons %q lack %q", reasons, c.reasonHas)
			}
			if tr.API != nil && len(tr.API.Disagrees) > 0 && c.wantFail == "" {
				t.Errorf("the API view disagrees: %v", tr.API.Disagrees)
			}
		})
	}
	if mode != "userspace" { // there the daemon's proxy keeps the affinity, out of the rules' sight
		t.Run("session affinity: a client that was sent somewhere goes there again", func(t *testing.T) {
			addr := harness.HostPort(sticky.Spec.ClusterIP, harness.ServiceTCPPort)
			counts := harness.CountHits(harness.HitForTest(t, client, "tcp", addr, 5, harness.HitOptions{Concurrency: 1}))
			if len(counts) != 1 {
				t.Fatalf("affinity: %s, want one pod", harness.FormatHits(counts))
			}
			var pod string
			for p := range counts {
				pod = p
			}
			tr, code := b.trace(t, "--to", addr, "--from", harness.ClientIP, "--in", "eth0")
			pods, _, _, reasons := tr.pods()
			if code != 0 || !slices.Equal(pods, []string{pod}) || !strings.Contains(strings.Join(reasons, ""), "session affinity binds this client") {
				t.Errorf("trace of a client bound to %s: exit %d, pods %v, reasons %q", pod, code, pods, reasons)
			}
			// Another client is not bound.
			tr, _ = b.trace(t, "--to", addr, "--from", "10.250.0.99", "--in", "eth0")
			if pods, _, _, _ := tr.pods(); len(pods) != 3 {
				t.Errorf("trace of a new client: pods %v, want all three", pods)
			}
		})
	}
	if mode == "userspace" {
		t.Run("daemon stopped: its listeners are gone", func(t *testing.T) {
			if err := b.d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			tr, code := b.trace(t, "--to", harness.HostPort(harness.NodeIP, tcpNP), "--from", harness.ClientIP, "--in", "eth0")
			_, _, _, reasons := tr.pods()
			if code != 1 || tr.Reaches || !strings.Contains(strings.Join(reasons, ""), "nothing listens there") {
				t.Errorf("trace with the daemon stopped: exit %d, reaches %v, reasons %q", code, tr.Reaches, reasons)
			}
			res := harness.HitForTest(t, client, "tcp", harness.HostPort(harness.NodeIP, tcpNP), 5, harness.HitOptions{Timeout: time.Second})
			harness.ExpectAllFail(t, "client -> NodePort with the daemon stopped", res, "refused")
		})
	}
	t.Run("usage errors exit 2", func(t *testing.T) {
		if _, code := b.cmd(t, "trace", "--to", "10.0.0.1"); code != 2 {
			t.Errorf("trace --to 10.0.0.1 (no port): exit %d, want 2", code)
		}
		if _, code := b.cmd(t, "trace"); code != 2 {
			t.Errorf("trace without a target: exit %d, want 2", code)
		}
	})
}
