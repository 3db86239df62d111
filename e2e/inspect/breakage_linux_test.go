package inspect

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
)

type diffJSON struct {
	Drift []struct {
		Kind, Dataplane, Service, Object, Detail string
	} `json:"drift"`
	Notes []string `json:"notes"`
}

type doctorJSON struct {
	Findings []struct {
		Check, Status, What, Why, Fix string
	} `json:"findings"`
	Problems int `json:"problems"`
}

func (b *bed) diff(t *testing.T) (diffJSON, int, string) {
	t.Helper()
	text, _ := b.cmd(t, "diff")
	out, code := b.cmd(t, "diff", "--json")
	var d diffJSON
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("diff --json: %v:\n%s", err, out)
	}
	return d, code, text
}

func (b *bed) doctor(t *testing.T) (doctorJSON, int, string) {
	t.Helper()
	text, _ := b.cmd(t, "doctor")
	out, code := b.cmd(t, "doctor", "--json")
	var d doctorJSON
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("doctor --json: %v:\n%s", err, out)
	}
	return d, code, text
}

// problems returns the checks doctor found a problem with.
func (d doctorJSON) problems() []string {
	var out []string
	for _, f := range d.Findings {
		if f.Status == "problem" {
			out = append(out, f.Check)
		}
	}
	return out
}

func TestDiffAndDoctorOnAHealthyNode(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			b := newBed(t, mode)
			b.CreateService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
			b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
			b.CreateService(t, "empty", nil)
			b.CreateService(t, "sticky", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP })
			b.SetEndpoints(t, "sticky", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
			b.CreateService(t, "remote", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			})
			b.SetEndpoints(t, "remote", harness.ReadyEndpoint(1), harness.RemoteEndpoint(2))
			b.start(t)
			d, code, text := b.diff(t)
			t.Logf("diff (exit %d):\n%s", code, text)
			if code != 0 || len(d.Drift) > 0 {
				t.Errorf("diff on a node the daemon just synced: exit %d, %d drifts", code, len(d.Drift))
			}
			doc, code, text := b.doctor(t)
			t.Logf("doctor (exit %d):\n%s", code, text)
			if code != 0 || doc.Problems > 0 {
				t.Errorf("doctor on a healthy node: exit %d, problems %v", code, doc.problems())
			}
		})
	}
}

// driftOf returns the drifts whose object contains obj, as "kind object [service]".
func (d diffJSON) driftOf(obj string) []string {
	var out []string
	for _, x := range d.Drift {
		if strings.Contains(x.Object, obj) {
			out = append(out, x.Kind+" "+x.Object+" ["+x.Service+"]")
		}
	}
	return out
}

func (d doctorJSON) finding(check string) (status, fix string) {
	for _, f := range d.Findings {
		if f.Check == check && (status == "" || f.Status == "problem") {
			status, fix = f.Status, f.Fix
		}
	}
	return status, fix
}

// TestDiffAndDoctorNameEachBreakage breaks the node one thing at a time (with the daemon stopped where it
// would repair the breakage itself), checks that diff or doctor names it, applies the fix they suggest,
// and checks that they are clean again.
func TestDiffAndDoctorNameEachBreakage(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) { breakages(t, mode) })
	}
}

func breakages(t *testing.T, mode string) {
	b := newBed(t, mode)
	web := b.CreateService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	dns := b.CreateService(t, "dns", nil)
	b.SetEndpoints(t, "dns", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	b.start(t)
	nodePort := harness.HostPort(harness.NodeIP, harness.NodePortOf(t, web, "tcp"))
	webTCP := b.NS + "/web:tcp"
	clean := func(t *testing.T) {
		t.Helper()
		// The restarted daemon's first sync may not know the ServiceCIDRs yet (it waits for Services,
		// EndpointSlices and its Node only), so mode nftables' drop rule for unallocated cluster IPs
		// can come one sync later: diff gets a few seconds to see it.
		d, code, text := b.diff(t)
		for deadline := time.Now().Add(5 * time.Second); (code != 0 || len(d.Drift) > 0) && time.Now().Before(deadline); {
			time.Sleep(500 * time.Millisecond)
			d, code, text = b.diff(t)
		}
		if code != 0 || len(d.Drift) > 0 {
			t.Errorf("diff after the fix: exit %d:\n%s", code, text)
		}
		if d, code, text := b.doctor(t); code != 0 || d.Problems > 0 {
			t.Errorf("doctor after the fix: exit %d:\n%s", code, text)
		}
	}
	stop := func(t *testing.T) {
		t.Helper()
		if err := b.d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
			t.Fatalf("stopping kube-proxy: %v", err)
		}
	}
	restart := func(t *testing.T) {
		t.Helper()
		b.d.Start()
	}
	clean(t)

	t.Run("daemon stopped and a Service's chain emptied", func(t *testing.T) {
		stop(t)
		doc, _, text := b.doctor(t)
		if st, fix := doc.finding("daemon health"); st != "problem" || !strings.Contains(fix, "systemctl start kube-proxy") {
			t.Errorf("doctor with the daemon stopped: daemon health %q, fix %q:\n%s", st, fix, text)
		}
		chain := ""
		if mode == "iptables" {
			chain = svcChain("KUBE-SVC-", b.NS+"/web:tcp", "tcp")
			b.sh(t, "iptables-nft", "-t", "nat", "-F", chain)
		} else {
			chain = "service-" + nftHash(b.NS+"/web/tcp/tcp")
			b.sh(t, "nft", "flush", "chain", "ip", "kube-proxy", chain)
		}
		d, code, text := b.diff(t)
		t.Logf("kube-proxy diff (exit %d):\n%s", code, text)
		got := d.driftOf(chain)
		if code != 1 || len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), "missing") || !strings.Contains(strings.Join(got, "\n"), webTCP) {
			t.Errorf("diff after emptying %s: exit %d, drifts %q:\n%s", chain, code, got, text)
		}
		tr, code := b.trace(t, "--to", nodePort, "--from", harness.ClientIP, "--in", "eth0")
		if code != 1 || tr.Reaches {
			t.Errorf("trace through an emptied Service chain: exit %d, reaches %v", code, tr.Reaches)
		}
		text, _ = b.cmd(t, "trace", "--to", nodePort, "--from", harness.ClientIP, "--in", "eth0")
		t.Logf("kube-proxy trace:\n%s", text)
		restart(t) // diff's and doctor's fix
		clean(t)
	})

	t.Run("jump into our rules removed from a built-in chain", func(t *testing.T) {
		stop(t)
		var obj string
		if mode == "iptables" {
			b.sh(t, "iptables-nft", "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")
			obj = "nat/PREROUTING"
		} else {
			handle := nftHandle(t, b, "nat-prerouting", "jump services")
			b.sh(t, "nft", "delete", "rule", "ip", "kube-proxy", "nat-prerouting", "handle", handle)
			obj = "nat-prerouting"
		}
		d, code, text := b.diff(t)
		if got := d.driftOf(obj); code != 1 || len(got) == 0 {
			t.Errorf("diff after removing the jump in %s: exit %d, drifts %q:\n%s", obj, code, got, text)
		}
		if tr, code := b.trace(t, "--to", nodePort, "--from", harness.ClientIP, "--in", "eth0"); code != 1 || tr.Reaches {
			t.Errorf("trace without the jump: exit %d, reaches %v", code, tr.Reaches)
		}
		restart(t)
		clean(t)
		if tr, code := b.trace(t, "--to", nodePort, "--from", harness.ClientIP, "--in", "eth0"); code != 0 || !tr.Reaches {
			t.Errorf("trace after the fix: exit %d, reaches %v", code, tr.Reaches)
		}
	})

	t.Run("another mode's or backend's rules beside ours", func(t *testing.T) {
		tool := "iptables-legacy" // mode iptables in nft: a stale legacy table
		check := "iptables backends"
		if mode == "nftables" {
			tool, check = "iptables-nft", "proxy modes" // mode nftables: stale iptables-mode chains
		}
		b.sh(t, tool, "-t", "nat", "-N", "KUBE-SERVICES")
		b.sh(t, tool, "-t", "nat", "-A", "KUBE-SERVICES", "-d", "10.96.99.99/32", "-p", "tcp", "--dport", "80", "-j", "RETURN")
		doc, code, text := b.doctor(t)
		t.Logf("kube-proxy doctor (exit %d):\n%s", code, text)
		st, fix := doc.finding(check)
		if code != 1 || st != "problem" {
			t.Errorf("doctor with %s KUBE-SERVICES beside ours: exit %d, %s %q:\n%s", tool, code, check, st, text)
		}
		if d, code, text := b.diff(t); code != 1 || len(d.Drift) == 0 {
			t.Errorf("diff with %s KUBE-SERVICES beside ours: exit %d:\n%s", tool, code, text)
		}
		// The fix: kube-proxy --cleanup, then a restart (mode iptables); a restart alone (mode nftables,
		// whose first sync removes the iptables modes' rules).
		stop(t)
		if strings.Contains(fix, "--cleanup") && mode == "iptables" {
			b.sh(t, b.bin, "--cleanup")
		}
		restart(t)
		clean(t)
	})

	if mode == "iptables" {
		t.Run("a rule ahead of our jump", func(t *testing.T) {
			port := strings.TrimPrefix(nodePort, harness.NodeIP+":")
			b.sh(t, "iptables-nft", "-t", "nat", "-I", "PREROUTING", "1", "-p", "tcp", "--dport", port, "-j", "RETURN")
			doc, code, text := b.doctor(t)
			st, fix := doc.finding("rules ahead of kube-proxy")
			if code != 1 || st != "problem" || !strings.Contains(fix, "-D PREROUTING 1") {
				t.Errorf("doctor with a RETURN ahead of our jump: exit %d, %q fix %q:\n%s", code, st, fix, text)
			}
			if d, _, text := b.diff(t); len(d.driftOf("nat/PREROUTING #1")) == 0 {
				t.Errorf("diff does not list the foreign rule:\n%s", text)
			}
			b.sh(t, "sh", "-c", fix[strings.Index(fix, "`")+1:strings.LastIndex(fix, "`")])
			clean(t)
		})

		t.Run("route_localnet off with localhost NodePorts on", func(t *testing.T) {
			b.sh(t, "sysctl", "-w", "net.ipv4.conf.all.route_localnet=0")
			doc, code, text := b.doctor(t)
			st, fix := doc.finding("sysctl net.ipv4.conf.all.route_localnet")
			if code != 1 || st != "problem" {
				t.Errorf("doctor with route_localnet=0: exit %d, %q:\n%s", code, st, text)
			}
			cmd := fix[strings.Index(fix, "`")+1 : strings.Index(fix[strings.Index(fix, "`")+1:], "`")+strings.Index(fix, "`")+1]
			b.sh(t, "sh", "-c", cmd)
			clean(t)
		})
	}

	t.Run("a UDP flow stuck on an endpoint that is gone", func(t *testing.T) {
		// What the daemon's conntrack cleanup removes when an endpoint goes: an entry for the Service
		// answered by an address no rule DNATs to any more (made here directly).
		b.sh(t, "conntrack", "-I", "-p", "udp", "-s", harness.ClientIP, "-d", dns.Spec.ClusterIP, "--sport", "40000", "--dport", "53",
			"--reply-src", "10.244.9.9", "--reply-dst", harness.ClientIP, "--reply-port-src", "5353", "--reply-port-dst", "40000", "--timeout", "300")
		doc, code, text := b.doctor(t)
		st, fix := doc.finding("stale UDP conntrack entries")
		if code != 1 || st != "problem" || !strings.Contains(fix, "conntrack -D") {
			t.Errorf("doctor with a stale UDP entry: exit %d, %q fix %q:\n%s", code, st, fix, text)
		}
		i := strings.Index(fix, "conntrack -D")
		b.sh(t, "sh", "-c", strings.SplitN(fix[i:], ";", 2)[0])
		clean(t)
	})
}

// svcChain is upstream's KUBE-SVC- style name: prefix + the first 16 characters of
// base32(sha256(servicePortName + protocol)), written here independently of the daemon's code.
func svcChain(prefix, servicePortName, proto string) string {
	sum := sha256.Sum256([]byte(servicePortName + proto))
	return prefix + base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// nftHash is upstream's nftables per-Service naming: 8 characters of base32(sha256(name)), "-", name.
func nftHash(name string) string {
	sum := sha256.Sum256([]byte(name))
	return base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" + name
}

// nftHandle returns the handle of the first rule of an ip kube-proxy chain containing text.
func nftHandle(t *testing.T, b *bed, chain, text string) string {
	t.Helper()
	out := b.sh(t, "nft", "-a", "list", "chain", "ip", "kube-proxy", chain)
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, text) {
			if i := strings.LastIndex(line, "# handle "); i >= 0 {
				return strings.TrimSpace(line[i+len("# handle "):])
			}
		}
	}
	t.Fatalf("no rule %q in %s:\n%s", text, chain, out)
	return ""
}
