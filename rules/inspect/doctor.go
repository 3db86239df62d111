package inspect

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/rules/nftables"
	"kube-proxy/rules/xtables"
)

// Finding is one check of `kube-proxy doctor`.
type Finding struct {
	// Check names what was checked ("iptables backends", "sysctl net.ipv4.ip_forward", ...).
	Check string `json:"check"`
	// Status is "ok", "problem" (something is wrong: exit 1), "warning" (may be wrong) or "skipped".
	Status string `json:"status"`
	// What is the state found; Why what it breaks; Fix the command or change that fixes it.
	What string `json:"what"`
	Why  string `json:"why,omitempty"`
	Fix  string `json:"fix,omitempty"`
}

// Doctor runs every check against the live node; env gives the configuration and how to reach the API
// and the daemon.
func Doctor(ctx context.Context, env *Env, live *Live) []Finding {
	var out []Finding
	add := func(f ...Finding) { out = append(out, f...) }
	add(checkBackends(ctx, live)...)
	add(checkForeign(live)...)
	add(checkModePrereqs(env.Config)...)
	add(checkSysctls(env.Config, live)...)
	add(checkConntrack(ctx, live)...)
	add(checkDaemon(ctx, env)...)
	add(checkAPI(ctx, env)...)
	for _, p := range live.Problems {
		add(Finding{Check: "reading the kernel's rules", Status: "warning", What: p})
	}
	return out
}

// Failed reports whether any finding is a problem.
func Failed(fs []Finding) bool {
	return slices.ContainsFunc(fs, func(f Finding) bool { return f.Status == "problem" })
}

func ok(check, what string) Finding { return Finding{Check: check, Status: "ok", What: what} }

// checkBackends: kube-proxy rules in both iptables backends, or in a backend other than the node's.
func checkBackends(ctx context.Context, live *Live) []Finding {
	const check = "iptables backends"
	with := map[xtables.Backend]bool{}
	for _, x := range live.XTables {
		if !x.Empty() {
			with[x.Backend] = true
		}
	}
	var out []Finding
	if with[xtables.BackendNFT] && with[xtables.BackendLegacy] {
		out = append(out, Finding{Check: check, Status: "problem",
			What: "kube-proxy chains exist in both iptables-nft and iptables-legacy",
			Why:  "both sets of rules are evaluated; the stale ones can DNAT packets to endpoints that are gone, and the legacy tables make every iptables-nft command warn",
			Fix:  "stop the proxy that wrote the old ones and remove them: `kube-proxy --cleanup` (removes both; then restart kube-proxy), or `iptables-legacy-save | grep -c KUBE-` to see them first"})
	}
	if len(with) == 1 {
		var ours xtables.Backend
		for b := range with {
			ours = b
		}
		if node, why, err := xtables.Detect(ctx); err == nil && node != ours {
			out = append(out, Finding{Check: check, Status: "problem",
				What: fmt.Sprintf("kube-proxy's rules are in %s, but the node's other components use %s (%s)", ours, node, why),
				Why:  "rules of two backends do not see each other's marks and chains in order; kubelet's and the CNI's rules and ours should share one backend",
				Fix:  fmt.Sprintf("restart kube-proxy so that it detects %s again (`systemctl restart kube-proxy`), after `kube-proxy --cleanup`", node)})
		}
	}
	if len(out) == 0 {
		what := "no kube-proxy iptables rules"
		if len(with) == 1 {
			for b := range with {
				what = "kube-proxy's iptables rules are all in " + string(b)
			}
		}
		out = append(out, ok(check, what))
	}
	modes := live.Modes()
	if len(modes) > 1 {
		out = append(out, Finding{Check: "proxy modes", Status: "problem",
			What: "rules of several modes are present: " + strings.Join(modes, ", "),
			Why:  "the first NAT rule a connection meets wins; a stale mode's rules can send traffic to endpoints that no longer exist",
			Fix:  "once kube-proxy has synced in its configured mode it removes the others' rules; if it does not run, `kube-proxy --cleanup` removes all of them"})
	} else {
		out = append(out, ok("proxy modes", "rules present: "+orNone(strings.Join(modes, ", "))))
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// checkForeign: other programs' rules ahead of the jumps into kube-proxy's chains, and other nftables
// tables on the hooks mode nftables uses.
func checkForeign(live *Live) []Finding {
	var out []Finding
	for _, x := range live.XTables {
		for _, f := range x.Foreign {
			if !f.AheadOfUs {
				continue
			}
			words, _ := splitWords(f.Rule)
			t := targetOf(words)
			status, why := "warning", "a packet it matches may be changed or stopped before the Service rules see it"
			switch {
			case f.Table == "nat" && (t == "DNAT" || t == "REDIRECT" || t == "ACCEPT" || t == "RETURN"):
				status, why = "problem", "a packet it matches never reaches the Service rules: its NAT verdict is taken first"
			case t == "DROP" || t == "REJECT":
				status, why = "problem", "a packet it matches is dropped before kube-proxy's rules accept it"
			case f.Table == "filter" && t == "ACCEPT":
				why = "a packet it matches skips kube-proxy's filter rules (source ranges, no-endpoint rejects)"
			}
			out = append(out, Finding{Check: "rules ahead of kube-proxy", Status: status,
				What: fmt.Sprintf("%s %s: rule %d of %s/%s comes before kube-proxy's jump: %s", x.Backend, x.Family, f.Position, f.Table, f.Chain, f.Rule),
				Why:  why,
				Fix:  fmt.Sprintf("check which program adds it; remove it with `iptables%s -t %s -D %s %d` if it is stale", backendSuffix(x), f.Table, f.Chain, f.Position)})
		}
	}
	if len(out) == 0 {
		out = append(out, ok("rules ahead of kube-proxy", "no other program's rule comes before kube-proxy's jumps"))
	}
	if len(live.NFTFamilies) > 0 && len(live.OtherNFTTables) > 0 {
		out = append(out, Finding{Check: "other nftables tables", Status: "warning",
			What: "other tables on this node: " + strings.Join(live.OtherNFTTables, ", "),
			Why:  "their base chains run on the same hooks as the kube-proxy table's; one that drops or accepts first decides for the packet",
			Fix:  "`nft list ruleset` to see their chains' hooks and priorities"})
	}
	return out
}

func backendSuffix(x *XTables) string {
	s := "-" + string(x.Backend)
	if x.Family == v1.IPv6Protocol {
		return "6" + s
	}
	return s
}

// checkModePrereqs: what the configured mode needs from the kernel and tools.
func checkModePrereqs(cfg *config.KubeProxyConfiguration) []Finding {
	var out []Finding
	if _, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_max"); err != nil {
		out = append(out, Finding{Check: "kernel module nf_conntrack", Status: "problem", What: "nf_conntrack is not loaded",
			Why: "every mode NATs through connection tracking", Fix: "`modprobe nf_conntrack` and add it to /etc/modules-load.d/"})
	} else {
		out = append(out, ok("kernel module nf_conntrack", "loaded"))
	}
	return append(out, prereqsFor(cfg.Mode)(cfg)...)
}

// nftablesPrereqs: mode nftables needs a recent kernel and nft.
func nftablesPrereqs(*config.KubeProxyConfiguration) []Finding {
	var out []Finding
	if err := nftables.Usable(); err != nil {
		out = append(out, Finding{Check: "mode nftables prerequisites", Status: "problem", What: err.Error(),
			Why: "mode nftables needs kernel 5.13 or later and nft 1.0.1 or later", Fix: "upgrade the kernel or nftables package, or use mode iptables"})
	} else {
		out = append(out, ok("mode nftables prerequisites", "kernel and nft are recent enough"))
	}
	return out
}

// ipvsPrereqs: mode ipvs needs the IPVS modules of its scheduler, and the ipset tool.
func ipvsPrereqs(cfg *config.KubeProxyConfiguration) []Finding {
	var out []Finding
	mods := []string{"ip_vs", "ip_vs_" + orDefault(cfg.IPVS.Scheduler, "rr")}
	var missing []string
	for _, m := range mods {
		if _, err := os.Stat(filepath.Join("/sys/module", m)); err != nil {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		out = append(out, Finding{Check: "mode ipvs prerequisites", Status: "problem", What: "kernel modules not loaded: " + strings.Join(missing, ", "),
			Why: "mode ipvs programs IPVS virtual servers with the configured scheduler", Fix: "`modprobe -a " + strings.Join(missing, " ") + "`"})
	} else {
		out = append(out, ok("mode ipvs prerequisites", "ip_vs and the scheduler's module are loaded"))
	}
	if _, err := exec.LookPath("ipset"); err != nil {
		out = append(out, Finding{Check: "mode ipvs prerequisites", Status: "warning", What: "the ipset tool is not installed", Fix: "apt-get install ipset"})
	}
	return out
}

// xtablesPrereqs: modes iptables and userspace need the iptables tools.
func xtablesPrereqs(*config.KubeProxyConfiguration) []Finding {
	var out []Finding
	if len(xtablesAvailable()) == 0 {
		out = append(out, Finding{Check: "mode iptables prerequisites", Status: "problem", What: "neither iptables-nft nor iptables-legacy is installed",
			Why: "mode iptables writes with iptables-restore", Fix: "apt-get install iptables"})
	} else {
		out = append(out, ok("mode iptables prerequisites", "iptables tools: "+strings.Join(xtablesAvailable(), ", ")))
	}
	return out
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func xtablesAvailable() []string {
	var out []string
	for _, b := range xtables.Backends {
		if xtables.Available(b, v1.IPv4Protocol) {
			out = append(out, string(b))
		}
	}
	return out
}

// readSysctl reads an integer under /proc/sys ("net/ipv4/ip_forward").
func readSysctl(name string) (int, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", name))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func checkSysctls(cfg *config.KubeProxyConfiguration, live *Live) []Finding {
	var out []Finding
	if v, err := readSysctl("net/ipv4/ip_forward"); err == nil && v != 1 {
		out = append(out, Finding{Check: "sysctl net.ipv4.ip_forward", Status: "problem", What: "net.ipv4.ip_forward = 0",
			Why: "packets DNATed to a pod on another node, or arriving for a NodePort, are not forwarded",
			Fix: "`sysctl -w net.ipv4.ip_forward=1` and set it in /etc/sysctl.d/"})
	} else if err == nil {
		out = append(out, ok("sysctl net.ipv4.ip_forward", "1"))
	}
	if localhostNodePorts(live) {
		if v, err := readSysctl("net/ipv4/conf/all/route_localnet"); err == nil && v != 1 {
			out = append(out, Finding{Check: "sysctl net.ipv4.conf.all.route_localnet", Status: "problem",
				What: "NodePorts are served on 127.0.0.1 by the rules, but route_localnet = 0",
				Why:  "the kernel drops a packet from 127.0.0.1 DNATed to a pod: connections to localhost:NODEPORT hang",
				Fix:  "`sysctl -w net.ipv4.conf.all.route_localnet=1` (kube-proxy sets it at start), or leave loopback out of nodePortAddresses / set iptables.localhostNodePorts: false"})
		} else if err == nil {
			out = append(out, ok("sysctl net.ipv4.conf.all.route_localnet", "1, as localhost NodePorts need"))
		}
	}
	bridges := bridgeInterfaces()
	if len(bridges) > 0 {
		if v, err := readSysctl("net/bridge/bridge-nf-call-iptables"); err != nil || v != 1 {
			what := "br_netfilter is not loaded"
			if err == nil {
				what = "net.bridge.bridge-nf-call-iptables = 0"
			}
			out = append(out, Finding{Check: "sysctl net.bridge.bridge-nf-call-iptables", Status: "problem",
				What: what + "; bridges on this node: " + strings.Join(bridges, ", "),
				Why:  "traffic between pods on the same bridge skips iptables and nftables: a pod reaching a Service whose endpoint is on the same bridge gets no reply (the reply is not un-NATed)",
				Fix:  "`modprobe br_netfilter && sysctl -w net.bridge.bridge-nf-call-iptables=1` and persist both"})
		} else {
			out = append(out, ok("sysctl net.bridge.bridge-nf-call-iptables", "1 (bridges: "+strings.Join(bridges, ", ")+")"))
		}
	}
	var strict []string
	if v, err := readSysctl("net/ipv4/conf/all/rp_filter"); err == nil && v == 1 {
		strict = append(strict, "all")
	}
	for _, i := range interfaceNames() {
		if v, err := readSysctl("net/ipv4/conf/" + i + "/rp_filter"); err == nil && v == 1 {
			strict = append(strict, i)
		}
	}
	if len(strict) > 0 {
		out = append(out, Finding{Check: "sysctl rp_filter", Status: "warning", What: "strict reverse-path filtering on: " + strings.Join(strict, ", "),
			Why: "with asymmetric routes (several interfaces, DSR, hairpin through a tunnel) strict rp_filter drops NodePort and LoadBalancer packets before kube-proxy sees them",
			Fix: "`sysctl -w net.ipv4.conf.all.rp_filter=2` (loose) where routes are asymmetric"})
	} else {
		out = append(out, ok("sysctl rp_filter", "not strict on any interface"))
	}
	// Mode iptables drops INVALID packets unless tcp_be_liberal is set (upstream's rule; mode nftables
	// has neither, as upstream).
	liberal, _ := readSysctl("net/netfilter/nf_conntrack_tcp_be_liberal")
	if !invalidDrop(live) && liberal != 1 && hasIPTablesMode(live) {
		out = append(out, Finding{Check: "conntrack INVALID packets", Status: "warning",
			What: "neither a rule dropping ctstate INVALID packets nor nf_conntrack_tcp_be_liberal = 1",
			Why:  "out-of-window TCP packets are passed un-NATed to the pod, which answers with a RST that kills the connection",
			Fix:  "set conntrack.tcpBeLiberal: true in the configuration, or let kube-proxy write its INVALID drop rule"})
	}
	return out
}

// hasIPTablesMode reports whether mode iptables' rules are present.
func hasIPTablesMode(live *Live) bool {
	for _, x := range live.XTables {
		if !x.Empty() && !x.ipvs() {
			return true
		}
	}
	return false
}

// localhostNodePorts reports whether the live rules serve NodePorts on 127.0.0.1 (mode iptables: the
// jump to KUBE-NODEPORTS without "! -d 127.0.0.0/8").
func localhostNodePorts(live *Live) bool {
	for _, x := range live.XTablesFor(v1.IPv4Protocol) {
		for _, r := range x.Tables.Rules("nat", "KUBE-SERVICES") {
			if strings.Contains(r, "-j KUBE-NODEPORTS") && !strings.Contains(r, "! -d 127.0.0.0/8") {
				return true
			}
		}
	}
	return false
}

// invalidDrop reports whether the live rules drop conntrack INVALID packets.
func invalidDrop(live *Live) bool {
	for _, x := range live.XTables {
		for _, c := range x.Tables.Chains("filter") {
			for _, r := range x.Tables.Rules("filter", c) {
				if strings.Contains(r, "INVALID") && strings.Contains(r, "DROP") {
					return true
				}
			}
		}
	}
	for _, t := range live.NFTText {
		if strings.Contains(t, "ct state invalid drop") {
			return true
		}
	}
	return false
}

func bridgeInterfaces() []string {
	var out []string
	for _, i := range interfaceNames() {
		if _, err := os.Stat(filepath.Join("/sys/class/net", i, "bridge")); err == nil {
			out = append(out, i)
		}
	}
	return out
}

func interfaceNames() []string {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []string
	for _, i := range ifs {
		out = append(out, i.Name)
	}
	return out
}

var dnatTargetRE = regexp.MustCompile(`(?:--to-destination|dnat (?:ip6? )?to|dnat to) (\[[0-9a-f:]+\]:\d+|[0-9.]+:\d+)|: ([0-9.]+) \. (\d+)|: ([0-9a-f:]+) \. (\d+)`)

// checkConntrack: the table's fill level and UDP entries that point at endpoints no rule has any more.
func checkConntrack(ctx context.Context, live *Live) []Finding {
	var out []Finding
	count, err1 := readSysctl("net/netfilter/nf_conntrack_count")
	max, err2 := readSysctl("net/netfilter/nf_conntrack_max")
	if err1 == nil && err2 == nil && max > 0 {
		out = append(out, conntrackFill(count, max))
	}
	if _, err := exec.LookPath("conntrack"); err != nil {
		out = append(out, Finding{Check: "stale UDP conntrack entries", Status: "skipped", What: "the conntrack tool is not installed", Fix: "apt-get install conntrack"})
		return out
	}
	services, endpoints := liveServiceAddrs(live), liveEndpoints(live)
	var stale []string
	var fixes []string
	for _, e := range udpEntries(ctx) {
		if !services[e.dst] || e.dst == e.replySrc || endpoints[e.replySrc] {
			continue
		}
		stale = append(stale, fmt.Sprintf("%s -> %s answered by %s", e.src, e.dst, e.replySrc))
		host, port, _ := net.SplitHostPort(e.dst)
		rhost, _, _ := net.SplitHostPort(e.replySrc)
		fix := fmt.Sprintf("conntrack -D -p udp --orig-dst %s --dport %s --reply-src %s", host, port, rhost)
		if !slices.Contains(fixes, fix) {
			fixes = append(fixes, fix)
		}
	}
	if len(stale) > 0 {
		out = append(out, Finding{Check: "stale UDP conntrack entries", Status: "problem",
			What: fmt.Sprintf("%d UDP flows to Services still go to endpoints no rule has any more: %s", len(stale), strings.Join(first(stale, 5), "; ")),
			Why:  "a UDP client that keeps sending (DNS is the classic case) stays stuck on the dead endpoint until the entry times out",
			Fix:  "delete them (a dry run: `conntrack -L -p udp --orig-dst ADDR` lists what this removes): " + strings.Join(first(fixes, 5), "; ")})
	} else {
		out = append(out, ok("stale UDP conntrack entries", "none"))
	}
	return out
}

// conntrackFill judges the conntrack table's fill level: a problem from 90 %.
func conntrackFill(count, max int) Finding {
	what := fmt.Sprintf("%d entries of a maximum of %d", count, max)
	if count*10 < max*9 {
		return ok("conntrack table", what)
	}
	return Finding{Check: "conntrack table", Status: "problem", What: what,
		Why: "when the table is full the kernel drops new connections (\"nf_conntrack: table full, dropping packet\")",
		Fix: fmt.Sprintf("raise it: `sysctl -w net.netfilter.nf_conntrack_max=%d`, and conntrack.maxPerCore / conntrack.min in the configuration so that kube-proxy keeps it there", max*2)}
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("and %d more", len(s)-n))
	}
	return s
}

type ctEntry struct{ src, dst, replySrc string }

// udpEntries lists the UDP conntrack entries (original source and destination, reply source).
func udpEntries(ctx context.Context) []ctEntry {
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, "conntrack", "-L", "-p", "udp")
	cmd.Stdout = &stdout
	if err := cmd.Run(); err != nil && stdout.Len() == 0 {
		return nil
	}
	var out []ctEntry
	for _, line := range strings.Split(stdout.String(), "\n") {
		kv := map[string][]string{}
		for _, f := range strings.Fields(line) {
			if k, v, ok := strings.Cut(f, "="); ok {
				kv[k] = append(kv[k], v)
			}
		}
		if len(kv["src"]) < 2 || len(kv["dst"]) < 1 || len(kv["sport"]) < 2 || len(kv["dport"]) < 1 {
			continue
		}
		out = append(out, ctEntry{
			src:      net.JoinHostPort(kv["src"][0], kv["sport"][0]),
			dst:      net.JoinHostPort(kv["dst"][0], kv["dport"][0]),
			replySrc: net.JoinHostPort(kv["src"][1], kv["sport"][1]),
		})
	}
	return out
}

// liveServiceAddrs are the ip:port of every Service rule the node holds (any protocol).
func liveServiceAddrs(live *Live) map[string]bool {
	out := map[string]bool{}
	for _, x := range live.XTables {
		for _, chain := range x.Tables.Chains("nat") {
			for _, r := range x.Tables.Rules("nat", chain) {
				words, err := splitWords(r)
				if err != nil {
					continue
				}
				dst, port := "", ""
				for i := 0; i+1 < len(words); i++ {
					switch words[i] {
					case "-d":
						dst = strings.Split(words[i+1], "/")[0]
					case "--dport":
						port = words[i+1]
					}
				}
				if dst != "" && port != "" {
					out[net.JoinHostPort(dst, port)] = true
				}
			}
		}
	}
	for _, f := range live.NFTFamilies {
		for _, e := range nftables.ServiceElements(live.NFT, f) {
			out[netip.AddrPortFrom(e.Addr, e.Port).String()] = true
		}
	}
	return out
}

// liveEndpoints are the ip:port of every DNAT target in the node's rules.
func liveEndpoints(live *Live) map[string]bool {
	out := map[string]bool{}
	add := func(text string) {
		for _, m := range dnatTargetRE.FindAllStringSubmatch(text, -1) {
			switch {
			case m[1] != "":
				host, port, err := net.SplitHostPort(m[1])
				if err == nil {
					out[net.JoinHostPort(host, port)] = true
				}
			case m[2] != "":
				out[net.JoinHostPort(m[2], m[3])] = true
			case m[4] != "":
				out[net.JoinHostPort(m[4], m[5])] = true
			}
		}
	}
	for _, x := range live.XTables {
		add(x.Save["nat"])
	}
	for _, t := range live.NFTText {
		add(t)
	}
	return out
}

// checkDaemon: the daemon's health and metrics endpoints.
func checkDaemon(ctx context.Context, env *Env) []Finding {
	hc := &http.Client{Timeout: 3 * time.Second}
	get := func(addr, path string) (int, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+localAddr(addr)+path, nil)
		if err != nil {
			return 0, nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		return resp.StatusCode, b, err
	}
	var out []Finding
	code, body, err := get(env.Config.HealthzBindAddress, "/healthz")
	switch {
	case err != nil:
		out = append(out, Finding{Check: "daemon health", Status: "problem", What: "no answer on " + env.Config.HealthzBindAddress + "/healthz: " + err.Error(),
			Why: "kube-proxy is not running (or not serving health): the rules are not kept up to date with the API",
			Fix: "`systemctl status kube-proxy` and `journalctl -u kube-proxy -n 50`; start it with `systemctl start kube-proxy`"})
	case code != http.StatusOK:
		var h struct{ LastUpdated, CurrentTime string }
		_ = json.Unmarshal(body, &h)
		out = append(out, Finding{Check: "daemon health", Status: "problem",
			What: fmt.Sprintf("/healthz answers %d (last successful sync %s, now %s)", code, orDefault(h.LastUpdated, "never"), h.CurrentTime),
			Why:  "changes wait longer than they should: syncs fail or the node is being deleted",
			Fix:  "`journalctl -u kube-proxy -n 50` shows why the syncs fail"})
	default:
		var h struct{ LastUpdated, CurrentTime string }
		_ = json.Unmarshal(body, &h)
		out = append(out, ok("daemon health", "healthy; last successful sync "+h.LastUpdated))
	}
	code, body, err = get(env.Config.MetricsBindAddress, "/metrics")
	if err != nil || code != http.StatusOK {
		what := fmt.Sprintf("no metrics on %s", env.Config.MetricsBindAddress)
		if err != nil {
			what += ": " + err.Error()
		}
		out = append(out, Finding{Check: "daemon metrics", Status: "warning", What: what})
		return out
	}
	sum, max := parseMetrics(body)
	failures := sum["kubeproxy_sync_proxy_rules_failures_total"]
	pending := sum["kubeproxy_sync_proxy_rules_service_changes_pending"] + sum["kubeproxy_sync_proxy_rules_endpoint_changes_pending"]
	last := max["kubeproxy_sync_proxy_rules_last_timestamp_seconds"]
	what := fmt.Sprintf("%.0f sync failures since start, %.0f changes pending", failures, pending)
	if last > 0 {
		what += ", last successful sync " + time.Unix(int64(last), 0).UTC().Format(time.RFC3339)
	}
	if failures > 0 {
		out = append(out, Finding{Check: "daemon syncs", Status: "warning", What: what,
			Why: "a failed sync keeps the rules that worked but leaves the changes since unapplied until a retry succeeds",
			Fix: "`journalctl -u kube-proxy | grep -i 'sync failed'`"})
	} else {
		out = append(out, ok("daemon syncs", what))
	}
	return out
}

// localAddr turns a bind address (0.0.0.0:10256) into one to connect to.
func localAddr(bind string) string {
	host, port, err := net.SplitHostPort(bind)
	if err != nil {
		return bind
	}
	if host == "" || host == "0.0.0.0" {
		host = "127.0.0.1"
	} else if host == "::" {
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}

// parseMetrics returns each metric's sum and maximum over its labels (text exposition format).
func parseMetrics(b []byte) (sum, max map[string]float64) {
	sum, max = map[string]float64{}, map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
			if j := strings.LastIndex(line, "} "); j >= 0 {
				rest = line[j+2:]
			}
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			continue
		}
		sum[name] += v
		if m, ok := max[name]; !ok || v > m {
			max[name] = v
		}
	}
	return sum, max
}

// checkAPI: the API server answers with the kubeconfig, and RBAC lets the node list and watch what the
// daemon watches.
func checkAPI(ctx context.Context, env *Env) []Finding {
	client, err := env.client()
	if err != nil {
		return []Finding{{Check: "API server", Status: "skipped", What: "no client: " + err.Error()}}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := client.ServerVersion(ctx)
	if err != nil {
		return []Finding{{Check: "API server", Status: "problem", What: "not reachable with " + orDefault(env.Config.ClientConnection.Kubeconfig, "the in-cluster config") + ": " + err.Error(),
			Why: "kube-proxy cannot learn about Service and endpoint changes; the node's rules go stale",
			Fix: "check the kubeconfig's server and certificates: `kubectl --kubeconfig " + orDefault(env.Config.ClientConnection.Kubeconfig, "...") + " get --raw /readyz`"}}
	}
	out := []Finding{ok("API server", "reachable, version "+v.GitVersion)}
	var denied []string
	for _, a := range []authv1.ResourceAttributes{
		{Verb: "list", Resource: "services"}, {Verb: "watch", Resource: "services"},
		{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"}, {Verb: "watch", Group: "discovery.k8s.io", Resource: "endpointslices"},
		{Verb: "list", Resource: "nodes"}, {Verb: "watch", Resource: "nodes"},
		{Verb: "list", Group: "networking.k8s.io", Resource: "servicecidrs"},
	} {
		allowed, err := client.ReviewAccess(ctx, a)
		if err != nil {
			out = append(out, Finding{Check: "RBAC", Status: "warning", What: "cannot ask the API what is allowed: " + err.Error()})
			return out
		}
		if !allowed {
			denied = append(denied, a.Verb+" "+strings.TrimPrefix(a.Group+"/"+a.Resource, "/"))
		}
	}
	if len(denied) > 0 {
		out = append(out, Finding{Check: "RBAC", Status: "problem", What: "the kubeconfig's user may not: " + strings.Join(denied, ", "),
			Why: "kube-proxy's watches fail or it never sees some objects",
			Fix: "bind the user to the system:node-proxier ClusterRole: `kubectl create clusterrolebinding kube-proxy-node-proxier --clusterrole=system:node-proxier --user=USER`"})
	} else {
		out = append(out, ok("RBAC", "list and watch of Services, EndpointSlices and Nodes allowed"))
	}
	return out
}
