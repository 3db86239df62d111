package systemdlab

import (
	"context"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// maxExposure is the highest `systemd-analyze security` exposure the shipped unit may have. Measured: 2.0
// on systemd 252 and 257 (the unit before issue 10: 4.6 on both).
const maxExposure = 2.0

// Capability numbers (linux/capability.h) of the unit's CapabilityBoundingSet=.
const (
	capNetBindService = 10
	capNetAdmin       = 12
	capNetRaw         = 13
	capSysResource    = 24
)

// endpointAddr is the ready endpoint of createService's Service, which the lab serves itself.
const endpointAddr = "10.200.1.5:8080"

// strictSyscallsDropIn makes a system call outside the unit's filter kill the daemon (SIGSYS) instead of
// failing with EPERM, so that a blocked call shows even where the daemon tolerates its failure.
const strictSyscallsDropIn = "[Service]\nSystemCallErrorNumber=kill\n"

// cleanupDropIn runs `kube-proxy --cleanup` under the unit's sandbox instead of the daemon.
const cleanupDropIn = `[Service]
Type=oneshot
ExecStart=
ExecStart=/usr/local/bin/kube-proxy --cleanup
ExecReload=
Restart=no
`

// modulesDropIn lets the daemon and its children load kernel modules again (README: for iptables-legacy
// nodes where nothing has loaded ip_tables, or mode ipvs on kernels before 5.16).
const modulesDropIn = `[Service]
ProtectKernelModules=no
CapabilityBoundingSet=CAP_SYS_MODULE
SystemCallFilter=@module
`

var exposureLine = regexp.MustCompile(`Overall exposure level for kube-proxy\.service: ([0-9]+\.[0-9])`)

// exposure runs `systemd-analyze security kube-proxy.service` and returns the overall exposure and what the
// analysis counts against the unit (its ✗ lines).
func (l *lab) exposure() (float64, string) {
	l.t.Helper()
	out := l.must("systemd-analyze security kube-proxy.service --no-pager")
	m := exposureLine.FindStringSubmatch(out)
	if m == nil {
		l.t.Fatalf("no exposure level in the output of systemd-analyze security:\n%s", out)
	}
	score, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		l.t.Fatal(err)
	}
	var open []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "✗") {
			open = append(open, line)
		}
	}
	return score, strings.Join(open, "\n")
}

// serveEndpoint answers TCP connections to endpointAddr inside the machine with a greeting, so that a
// Service's traffic can be followed to its endpoint. The listener closes when the test ends.
func (l *lab) serveEndpoint() {
	l.t.Helper()
	ip, _, _ := net.SplitHostPort(endpointAddr)
	l.must("ip addr add " + ip + "/32 dev lo")
	ln, err := l.m.NS.Listen("tcp", endpointAddr)
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "endpoint %s\n", endpointAddr)
			c.Close()
		}
	}()
}

// reachService connects to the Service's cluster IP from inside the machine (a client on the node) and
// fails the test unless the endpoint answers.
func (l *lab) reachService(when string, svc labService) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := l.m.NS.DialContext(ctx, "tcp", net.JoinHostPort(svc.ClusterIP, "80"))
	if err != nil {
		l.t.Errorf("%s: connecting to %s:80: %v", when, svc.ClusterIP, err)
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if want := "endpoint " + endpointAddr + "\n"; string(b) != want {
		l.t.Errorf("%s: %s:80 answered %q (%v), want %q from the endpoint", when, svc.ClusterIP, b, err, want)
	}
}

// sandboxInForce checks the running daemon's process: its capability bounding set is the unit's (as far as
// the machine's own set goes), it cannot gain privileges, a seccomp filter is on, and its view of the file
// system is read-only but for the paths the unit opens.
func (l *lab) sandboxInForce(when string) {
	l.t.Helper()
	pid := l.prop("MainPID")
	status := func(p string) map[string]string {
		got := map[string]string{}
		for _, line := range strings.Split(l.must("cat /proc/"+p+"/status"), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				got[k] = strings.TrimSpace(v)
			}
		}
		return got
	}
	mask := func(s string) uint64 {
		v, err := strconv.ParseUint(s, 16, 64)
		if err != nil {
			l.t.Fatalf("capability mask %q: %v", s, err)
		}
		return v
	}
	daemon, machine := status(pid), status("1")
	unitCaps := uint64(1)<<capNetBindService | 1<<capNetAdmin | 1<<capNetRaw | 1<<capSysResource
	if got, want := mask(daemon["CapBnd"]), unitCaps&mask(machine["CapBnd"]); got != want {
		l.t.Errorf("%s: the daemon's CapBnd is %#x, want %#x (the unit's set within the machine's)", when, got, want)
	}
	if daemon["NoNewPrivs"] != "1" || daemon["Seccomp"] != "2" {
		l.t.Errorf("%s: the daemon has NoNewPrivs=%s Seccomp=%s, want 1 and 2 (filter)", when, daemon["NoNewPrivs"], daemon["Seccomp"])
	}
	const probe = `for p in /usr /etc /var/lib/kube-proxy /run /run/kube-proxy /tmp /proc/sys/net/ipv4/conf/all/route_localnet; do
  if test -w $p; then echo "$p rw"; else echo "$p ro"; fi
done`
	got := strings.Fields(l.must("nsenter -t " + pid + " -m -- sh -c '" + probe + "'"))
	want := strings.Fields(`/usr ro /etc ro /var/lib/kube-proxy ro /run ro /run/kube-proxy rw /tmp rw
		/proc/sys/net/ipv4/conf/all/route_localnet rw`)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		l.t.Errorf("%s: the daemon's file system: %v, want %v", when, got, want)
	}
}

// daemonExited fails the test when the daemon's last run ended by a signal (a SIGSYS from the system call
// filter) rather than by exiting.
func (l *lab) daemonExited(when string) {
	l.t.Helper()
	p := l.props("ExecMainCode", "ExecMainStatus", "Result")
	if p["ExecMainCode"] != "1" || p["Result"] == "signal" || p["Result"] == "core-dump" {
		l.t.Errorf("%s: the daemon did not exit on its own: %v", when, p)
	}
}

// TestHardening measures the shipped unit's exposure with `systemd-analyze security` (failing above
// maxExposure) and checks that the daemon works under its sandbox: mode iptables with iptables-nft and
// iptables-legacy (the xtables lock on a read-only /run) and mode nftables, each writing its rules and
// carrying a Service's traffic to its endpoint, the sysctls under /proc/sys/net written, reload (applied and
// refused), the switches between modes that clean up the other mode's rules, and `kube-proxy --cleanup`.
// Then, with a failing system call killing the daemon instead of returning EPERM, every mode again,
// including mode ipvs, which this kernel cannot run: it must fail with the same message as it does outside
// the sandbox (the kernel has no IPVS), not with a signal. Last, the README's drop-in that allows module
// loading is checked to load and run.
func TestHardening(t *testing.T) {
	c := requireLab(t)
	blocks := guideBlocks(t)
	for _, suite := range Suites {
		t.Run(suite.Name, func(t *testing.T) {
			ensureRootfs(t, suite)
			svc := createService(t, c)
			l := newLab(t, c, suite)
			l.must(blocks["install"])
			l.must(blocks["config"])
			l.verifyUnit("/etc/systemd/system/kube-proxy.service")
			l.must("systemctl daemon-reload")
			score, open := l.exposure()
			t.Logf("systemd %d: systemd-analyze security kube-proxy.service: overall exposure %.1f; counted against it:\n%s",
				suite.Systemd, score, open)
			if score > maxExposure {
				t.Errorf("systemd %d rates the unit's exposure %.1f, worse than %.1f", suite.Systemd, score, maxExposure)
			}

			base := l.must("cat " + configPath)
			if !strings.Contains(base, "mode: iptables\n") {
				t.Fatalf("the guide's config does not say mode: iptables:\n%s", base)
			}
			withMode := func(mode, extra string) string {
				return strings.Replace(base, "mode: iptables\n", "mode: "+mode+"\n", 1) + extra
			}
			// The machine has only a loopback: the endpoint lives on it, and so does the route to the
			// cluster IP that a client on the node needs before the rules rewrite its destination.
			l.serveEndpoint()
			l.must("ip route add " + svc.ClusterIP + "/32 dev lo")
			// Values the daemon must change through its read-only /proc/sys.
			l.must("sysctl -qw net.ipv4.conf.all.route_localnet=0 net.netfilter.nf_conntrack_tcp_timeout_established=432000")
			// The test starts the unit more often than its start rate limit allows (5 in 10 s).
			systemctl := func(verb string) Result {
				return l.run("systemctl reset-failed kube-proxy 2>/dev/null; systemctl daemon-reload && systemctl " + verb + " kube-proxy")
			}
			syncPeriod := func(section string) any { return field(l.configz(10249), section+".syncPeriod") }
			reload := func(when, mode, section string) {
				t.Helper()
				l.writeConfig(withMode(mode, section+":\n  syncPeriod: 17s\n"))
				if r := l.run("systemctl reload kube-proxy"); r.Code != 0 {
					t.Errorf("%s: systemctl reload: exit %d:\n%s", when, r.Code, r.Out)
				}
				if got := syncPeriod(section); got != "17s" {
					t.Errorf("%s: after the reload %s.syncPeriod = %v, want 17s", when, section, got)
				}
				l.writeConfig(withMode(mode, section+":\n  syncPeriod: banana\n"))
				if r := l.run("systemctl reload kube-proxy"); r.Code == 0 {
					t.Errorf("%s: the reload of an invalid config succeeded:\n%s", when, r.Out)
				}
				l.wantProps(when+", after the refused reload", map[string]string{"ActiveState": "active", "SubState": "running"})
				l.writeConfig(withMode(mode, ""))
			}

			// Mode iptables, iptables-nft.
			if r := systemctl("enable --now"); r.Code != 0 {
				t.Fatalf("systemctl enable --now: exit %d:\n%s", r.Code, r.Out)
			}
			l.wantProps("mode iptables", map[string]string{"ActiveState": "active", "SubState": "running", "NRestarts": "0"})
			l.sandboxInForce("mode iptables")
			if nat := l.natRules(); !strings.Contains(nat, svc.Comment()) {
				t.Errorf("mode iptables: no rules for %s in the nat table:\n%s", svc.Comment(), nat)
			}
			if got := l.must("sysctl -n net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_tcp_timeout_established"); strings.Fields(got)[0] != "1" ||
				strings.Fields(got)[1] != "86400" {
				t.Errorf("mode iptables: route_localnet and nf_conntrack_tcp_timeout_established = %q, want 1 and 86400 (written by the daemon)", got)
			}
			l.reachService("mode iptables", svc)
			reload("mode iptables", "iptables", "iptables")

			// Mode nftables; its first sync removes mode iptables' rules.
			l.writeConfig(withMode("nftables", ""))
			if r := systemctl("restart"); r.Code != 0 {
				t.Fatalf("restart in mode nftables: exit %d:\n%s", r.Code, r.Out)
			}
			l.wantProps("mode nftables", map[string]string{"ActiveState": "active", "SubState": "running"})
			l.sandboxInForce("mode nftables")
			if table := l.must("nft list table ip kube-proxy"); !strings.Contains(table, svc.ClusterIP) {
				t.Errorf("mode nftables: the kube-proxy table lacks %s:\n%s", svc.ClusterIP, table)
			}
			l.waitFor("mode nftables to remove mode iptables' rules", 15*time.Second, func() bool {
				return !strings.Contains(l.natRules(), "KUBE-")
			})
			l.reachService("mode nftables", svc)
			reload("mode nftables", "nftables", "nftables")

			// Back to mode iptables, which removes the nftables table.
			l.writeConfig(withMode("iptables", ""))
			if r := systemctl("restart"); r.Code != 0 {
				t.Fatalf("restart back in mode iptables: exit %d:\n%s", r.Code, r.Out)
			}
			l.waitFor("mode iptables to remove the nftables table", 15*time.Second, func() bool {
				return l.run("nft list table ip kube-proxy").Code != 0
			})
			l.reachService("back in mode iptables", svc)

			// Mode iptables on a node whose iptables is iptables-legacy, without an xtables lock yet.
			l.must("systemctl stop kube-proxy && nft flush ruleset && rm -f /run/xtables.lock && " +
				"update-alternatives --set iptables /usr/sbin/iptables-legacy && update-alternatives --set ip6tables /usr/sbin/ip6tables-legacy")
			if r := systemctl("start"); r.Code != 0 {
				t.Fatalf("start with iptables-legacy: exit %d:\n%s", r.Code, r.Out)
			}
			if j := l.journal(); !strings.Contains(j, `"Using iptables backend" backend="legacy"`) {
				t.Errorf("the daemon did not choose iptables-legacy:\n%s", j)
			}
			if nat := l.must("iptables-legacy-save -t nat"); !strings.Contains(nat, svc.Comment()) {
				t.Errorf("iptables-legacy: no rules for %s:\n%s", svc.Comment(), nat)
			}
			l.reachService("mode iptables, iptables-legacy", svc)
			reload("mode iptables, iptables-legacy", "iptables", "iptables")

			// kube-proxy --cleanup under the same sandbox.
			l.must("systemctl stop kube-proxy && mkdir -p /etc/systemd/system/kube-proxy.service.d")
			l.must("cat >/etc/systemd/system/kube-proxy.service.d/cleanup.conf <<'EOF'\n" + cleanupDropIn + "EOF")
			l.verifyUnit("kube-proxy.service")
			if r := systemctl("start"); r.Code != 0 {
				t.Errorf("kube-proxy --cleanup under the sandbox: exit %d:\n%s", r.Code, r.Out)
			}
			if nat := l.must("iptables-legacy-save -t nat"); strings.Contains(nat, "KUBE-") {
				t.Errorf("KUBE- chains left after --cleanup under the sandbox:\n%s", nat)
			}
			l.must("rm /etc/systemd/system/kube-proxy.service.d/cleanup.conf")

			// Every mode again, a blocked system call now fatal.
			l.must("cat >/etc/systemd/system/kube-proxy.service.d/strict.conf <<'EOF'\n" + strictSyscallsDropIn + "EOF")
			l.verifyUnit("kube-proxy.service")
			l.must("systemctl daemon-reload")
			if got := l.prop("SystemCallErrorNumber"); got == "1" || got == "" {
				t.Fatalf("SystemCallErrorNumber=%q with the strict drop-in", got)
			}
			for _, mode := range []string{"iptables", "nftables"} {
				when := "mode " + mode + ", failing system calls fatal"
				l.writeConfig(withMode(mode, ""))
				if r := systemctl("restart"); r.Code != 0 {
					t.Fatalf("%s: restart: exit %d:\n%s", when, r.Code, r.Out)
				}
				l.reachService(when, svc)
				reload(when, mode, mode)
				l.must("systemctl stop kube-proxy")
				l.daemonExited(when)
			}
			l.must("cat >/etc/systemd/system/kube-proxy.service.d/cleanup.conf <<'EOF'\n" + cleanupDropIn + "EOF")
			if r := systemctl("start"); r.Code != 0 {
				t.Errorf("--cleanup, failing system calls fatal: exit %d:\n%s", r.Code, r.Out)
			}
			l.daemonExited("--cleanup, failing system calls fatal")
			l.must("rm /etc/systemd/system/kube-proxy.service.d/cleanup.conf && systemctl daemon-reload")

			// Mode ipvs stops where this kernel does, inside the sandbox as outside it.
			l.writeConfig(withMode("ipvs", ""))
			outside := l.run("timeout 30 kube-proxy --config=" + configPath)
			const noIPVS = "IPVS is not usable: the kernel has no IPVS"
			if outside.Code == 0 || !strings.Contains(outside.Out, noIPVS) {
				t.Fatalf("mode ipvs outside the sandbox: exit %d, want %q:\n%s", outside.Code, noIPVS, outside.Out)
			}
			if r := systemctl("start"); r.Code == 0 {
				t.Errorf("mode ipvs started on a kernel without IPVS")
			}
			l.daemonExited("mode ipvs, failing system calls fatal")
			if j := l.journal(); !strings.Contains(j, noIPVS) {
				t.Errorf("mode ipvs under the sandbox did not fail for want of IPVS:\n%s", j)
			}
			l.must("systemctl stop kube-proxy; systemctl reset-failed kube-proxy; rm /etc/systemd/system/kube-proxy.service.d/strict.conf")

			// The README's drop-in that allows module loading.
			l.must("cat >/etc/systemd/system/kube-proxy.service.d/modules.conf <<'EOF'\n" + modulesDropIn + "EOF")
			l.verifyUnit("kube-proxy.service")
			l.writeConfig(withMode("iptables", ""))
			if r := systemctl("start"); r.Code != 0 {
				t.Fatalf("start with the modules drop-in: exit %d:\n%s", r.Code, r.Out)
			}
			if f := l.prop("SystemCallFilter"); !strings.Contains(" "+f+" ", " finit_module ") {
				t.Errorf("with the modules drop-in, finit_module is not allowed: %s", f)
			}
			l.reachService("with the modules drop-in", svc)
			modScore, _ := l.exposure()
			t.Logf("systemd %d: with the modules drop-in: overall exposure %.1f", suite.Systemd, modScore)
		})
	}
}
