//go:build linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"kube-proxy/e2e/faults"
	"kube-proxy/e2e/floor"
	"kube-proxy/e2e/ipvsvm"
	"kube-proxy/e2e/probe"
)

// The fault rows for mode ipvs: the daemon runs against the host's apiserver with traffic flowing from
// the client namespace to Service web, one thing at a time breaks, and each row says what was done, how
// many connections to web were sent and failed meanwhile, how long the node took to converge and what an
// operator sees. They mirror e2e/faults (faults_linux_test.go), whose rows run on the host's kernel in
// modes iptables and nftables; TestIPVSFaultsInVM records them with e2e/faults' appender.

// fb is the fault rows' world: parameters, the running daemon and how many daemons were started.
type fb struct {
	p       *ipvsvm.FaultsParams
	d       *kp
	started int
	targets []string
	where   string // the Action's suffix: where it ran
	sync    time.Duration
}

// faultRows measures the rows p asks for and reports each as CASE fault-<name>; false if one failed.
func faultRows(p *ipvsvm.FaultsParams) bool {
	b := &fb{p: p, targets: []string{addr(p.WebIP, 80), addr(ipvsvm.NodeIP, p.WebNodePort)}}
	release, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	b.where = fmt.Sprintf(" — in a qemu VM (Debian's %s kernel, software emulation: TCG)", strings.TrimSpace(string(release)))
	if p.FaultsBinary != "" {
		if err := os.Chmod(p.FaultsBinary, 0o755); err != nil { // sent as a file
			report("CASE", "faults", "FAIL", err)
			return false
		}
	}
	var err error
	if b.sync, err = time.ParseDuration(p.SyncPeriod); err != nil {
		report("CASE", "faults", "FAIL", err)
		return false
	}
	if err := b.setup(); err != nil {
		report("CASE", "faults", "FAIL", err)
		if b.d != nil {
			b.d.dump()
			b.d.stop()
		}
		return false
	}
	rows := map[string]func() error{
		"baseline": b.baseline, "apiserver-down": b.apiserverDown, "state-removed": b.stateRemoved,
		"reload": b.reload, "kill-during-sync": b.killDuringSync, "apply-failing": b.applyFailing,
	}
	ok := true
	for _, name := range ipvsvm.FaultNames {
		if len(p.Faults) > 0 && !slices.Contains(p.Faults, name) {
			continue
		}
		if name == "apply-failing" && p.FaultsBinary == "" {
			report("CASE", "fault-"+name, "SKIP", "no faults build (KP_FAULTS_BINARY)")
			continue
		}
		start := time.Now()
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			return rows[name]()
		}()
		took := time.Since(start).Round(time.Millisecond)
		if err != nil {
			ok = false
			report("CASE", "fault-"+name, "FAIL", fmt.Sprintf("(%v) %v", took, err))
			if b.d != nil {
				b.d.dump()
			}
		} else {
			report("CASE", "fault-"+name, "PASS", fmt.Sprintf("(%v)", took))
		}
		// The next row starts from a daemon that runs and serves.
		if name == ipvsvm.FaultNames[len(ipvsvm.FaultNames)-1] {
			break
		}
		if err := b.ensureDaemon(); err != nil {
			report("CASE", "faults", "FAIL", fmt.Sprintf("after %s: %v", name, err))
			return false
		}
	}
	if b.d != nil {
		b.d.stop()
	}
	if out, err := shOut(p.Binary, "--cleanup"); err != nil {
		report("NOTE", "kube-proxy --cleanup: "+strings.TrimSpace(out))
	}
	return ok
}

// setup gives the VM its link to the host (10.0.2.2 is the host's loopback), starts the daemon and waits
// for web to answer on both targets.
func (b *fb) setup() error {
	for _, c := range [][]string{
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "addr", "replace", "10.0.2.15/24", "dev", "eth0"},
		{"ip", "route", "replace", "default", "via", "10.0.2.2"},
	} {
		if err := sh(c...); err != nil {
			return err
		}
	}
	return b.ensureDaemon()
}

// ensureDaemon starts the daemon (its usual binary) unless one runs, and waits until web answers.
func (b *fb) ensureDaemon() error {
	if b.d == nil || b.d.exited() {
		d, err := b.start(b.p.Binary)
		if err != nil {
			return err
		}
		if _, err := d.waitReady(3 * time.Minute); err != nil {
			return err
		}
	}
	for _, tg := range b.targets {
		if _, err := reachable(tg, time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// row completes a row (mode, where it ran) and sends it to the host.
func (b *fb) row(r faults.Row) {
	r.Mode = "ipvs"
	r.Action += b.where
	j, err := json.Marshal(r)
	if err != nil {
		report("NOTE", "row: "+err.Error())
		return
	}
	report("ROW", string(j))
}

// control asks the host to do something and returns its answer (a cluster IP for the create actions).
func (b *fb) control(action string, args url.Values) (string, error) {
	u := b.p.Control + "/" + action
	if len(args) > 0 {
		u += "?" + args.Encode()
	}
	c := &http.Client{Timeout: 10 * time.Minute}
	resp, err := c.Get(u)
	if err != nil {
		return "", fmt.Errorf("asking the host to %s: %w", action, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("asking the host to %s: %s: %s", action, resp.Status, strings.TrimSpace(string(body)))
	}
	return strings.TrimSpace(string(body)), nil
}

func failures(res []result) int {
	n := 0
	for _, r := range res {
		if r.err != "" {
			n++
		}
	}
	return n
}

// describe names the first five failed connections: when each ended, its error and how long the guest
// stalled while it lasted.
func describe(res []result) string {
	var out []string
	for _, r := range res {
		if r.err != "" && len(out) < 5 {
			out = append(out, fmt.Sprintf("at %s (guest stalled %v meanwhile) %s: %s", r.at.Format("15:04:05.000"),
				r.stalled.Round(time.Millisecond), r.err, r.detail))
		}
	}
	return strings.Join(out, "; ")
}

func orNone(s string) string {
	if s == "" {
		return "none failed"
	}
	return s
}

// noFailures is e2e/faults' expectNoFailures: timeouts of connections during which a CPU of the guest
// stalled for half their time or more are excused (the host did not run the VM: see stallWatch); the
// other failures are checked against the host's floor (package kube-proxy/e2e/floor: isolated timeouts,
// at most one per ten thousand connections, rounded up). Any refusal or reset, or more timeouts, is an
// error.
func noFailures(what string, res []result) error {
	n := failures(res)
	if n == 0 {
		return nil
	}
	stalled := 0
	for _, r := range res {
		if r.err == "timeout" && r.stalled >= stallExcuses {
			stalled++
		}
	}
	if stalled > 0 {
		logf("%s: %d of %d connections timed out while a CPU of the guest stalled ≥ %v (the host did not run it)", what, stalled, len(res), stallExcuses)
	}
	// The stall-excused timeouts count as connections made, not as failures, for the floor.
	rest := floor.Excused(len(res), func(i int) string {
		if r := res[i]; r.err != "timeout" || r.stalled < stallExcuses {
			return r.err
		}
		return ""
	})
	if stalled+rest == n {
		logf("%s: %d of %d connections timed out (within the baseline's floor): %s", what, n, len(res), describe(res))
		return nil
	}
	return fmt.Errorf("%s: %d of %d connections failed: %s", what, n, len(res), describe(res))
}

// stallExcuses is the stall of the guest that excuses a timeout: half a connection's time.
const stallExcuses = time.Second

func within(what string, d, limit time.Duration) error {
	if d > limit {
		return fmt.Errorf("%s took %v, want ≤ %v", what, d.Round(time.Millisecond), limit)
	}
	return nil
}

// healthz returns the daemon's /healthz code, probe.NoAnswer (-1) for no answer.
func healthz() int {
	code, err := healthzErr("127.0.0.1:10256")
	if err != nil {
		return probe.NoAnswer
	}
	return code
}

func healthzErr(hostPort string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	code, _, err := probe.Get(ctx, http.DefaultClient, "http://"+hostPort+"/healthz")
	return code, err
}

// formatCodes shows health codes as e2e/faults does (probe.FormatCodes: "200 ×12, 503 ×3"), "not asked"
// when there are none.
func formatCodes(codes map[int]int) string {
	if s := probe.FormatCodes(codes); s != "" {
		return s
	}
	return "not asked"
}

// metric sums the samples of a metric of the daemon's /metrics whose labels contain label ("" for all);
// -1 when /metrics does not answer.
func metric(name, label string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, body, err := probe.Get(ctx, http.DefaultClient, "http://127.0.0.1:10249/metrics")
	if err != nil {
		return -1
	}
	return probe.SumMetric(body, name, label)
}

// reachable polls addr from the client until one connection succeeds and says how long that took.
func reachable(target string, limit time.Duration) (time.Duration, error) {
	took, err := probe.Reachable(limit, func() error {
		_, _, err := onceIn("client", "tcp", target, 500*time.Millisecond)
		return err
	})
	if err != nil {
		return took, fmt.Errorf("%s not reachable within %v: %v", target, limit, err)
	}
	return took, nil
}

// onceIn is once from namespace ns.
func onceIn(ns, network, target string, timeout time.Duration) (name, src string, err error) {
	nerr := inNS(ns, func() error {
		name, src, err = once(network, target, timeout)
		return nil
	})
	if nerr != nil {
		return "", "", nerr
	}
	return name, src, err
}

// diffSummary runs `kube-proxy diff --json` and sums up its drift: "no drift", or how many objects of
// each kind, with the first one named.
func diffSummary(binary, config string) string {
	out, err := exec.Command(binary, "diff", "--config", config, "--json").Output()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return "failed: " + err.Error()
	}
	var rep struct {
		Drift []struct{ Kind, Object, Detail string }
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return fmt.Sprintf("exit %d, unreadable: %v", code, err)
	}
	if len(rep.Drift) == 0 {
		return fmt.Sprintf("no drift (exit %d)", code)
	}
	kinds := map[string]int{}
	for _, d := range rep.Drift {
		kinds[d.Kind]++
	}
	return fmt.Sprintf("exit %d, %d drifts %s, e.g. %s %s", code, len(rep.Drift), formatCounts(kinds), rep.Drift[0].Kind, rep.Drift[0].Object)
}

func mustDuration(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}

func firstOf(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}
