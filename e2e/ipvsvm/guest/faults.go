//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"kube-proxy/e2e/faults"
	"kube-proxy/e2e/floor"
	"kube-proxy/e2e/ipvsvm"
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

// baseline sends the rows' traffic with nothing broken: the floor of the other rows' failed connections.
// It also checks that the periodic full syncs meanwhile, with nothing changed, read the kernel as the
// daemon wrote it: they write nothing.
func (b *fb) baseline() error {
	d := mustDuration(b.p.Baseline)
	offset := b.d.logSize()
	tr := startTraffic(b.targets)
	time.Sleep(d)
	res := tr.stop()
	// At least one periodic full sync: one may not have fallen within a short baseline.
	_ = waitFor(3*b.sync+30*time.Second, func() error {
		if n, _ := b.d.fullSyncWrites(offset); n == 0 {
			return errors.New("no full sync yet")
		}
		return nil
	})
	resyncs, wrote := b.d.fullSyncWrites(offset)
	b.row(faults.Row{Order: 5, Fault: fmt.Sprintf("none: the baseline, %v", d),
		Action: "the same traffic as the other rows (4 connections at a time, 2 s each, to a cluster IP and a NodePort, each from its own client address) and nothing else",
		Sent:   len(res), Failed: failures(res), Sees: "the floor for the other rows' failed connections: " + orNone(describe(res))})
	if len(res) == 0 {
		return errors.New("no connection was made")
	}
	logf("baseline: %d periodic full syncs", resyncs)
	if resyncs == 0 {
		return errors.New("no periodic full sync to check")
	}
	if len(wrote) > 0 {
		return fmt.Errorf("full syncs of an unchanged kernel wrote to it: %s", strings.Join(wrote, "; "))
	}
	return nil
}

// fullSyncWrites reads the daemon's full syncs since offset: how many there were, and the log lines of
// those that wrote something to the kernel.
func (d *kp) fullSyncWrites(offset int) (n int, wrote []string) {
	log := d.log()
	if offset > len(log) {
		offset = 0
	}
	for _, l := range regexp.MustCompile(`(?m)^.*"Synced IPVS" .*full=true .*$`).FindAllString(log[offset:], -1) {
		n++
		if !strings.Contains(l, ` writes="0" `) {
			wrote = append(wrote, l)
		}
	}
	return n, wrote
}

// apiserverDown has the host stop its apiserver with traffic flowing, start it again, then create a
// Service and times it from its creation to its first answer.
func (b *fb) apiserverDown() error {
	down := mustDuration(b.p.APIDown)
	d := b.d
	offset := d.logSize()
	o := observe(b.targets)
	if _, err := b.control(ipvsvm.ActionStopAPIServer, nil); err != nil {
		o.end()
		return err
	}
	stopped := time.Now()
	// How a connection to the stopped apiserver fails from the VM (qemu's user network stands between).
	dial, conns := "not tried", "not read"
	if api, err := apiserverAddr(); err == nil {
		time.Sleep(2 * time.Second)
		conns = formatCounts(tcpStates(api))
		c, err := net.DialTimeout("tcp", api, 3*time.Second)
		switch {
		case err == nil:
			c.Close()
			dial = "accepted"
		default:
			dial = errClass(err) + fmt.Sprintf(" after %v", time.Since(stopped).Round(100*time.Millisecond))
		}
	}
	time.Sleep(down - time.Since(stopped))
	starting := time.Now()
	if _, err := b.control(ipvsvm.ActionStartAPIServer, nil); err != nil {
		o.end()
		return err
	}
	started := time.Now()
	res, seen := o.end()
	// When connections failed, against the apiserver's start on the host (which competes with the VM
	// for the host's two cores).
	when := ""
	if failures(res) > 0 {
		var at []string
		for _, r := range res {
			if r.err != "" && len(at) < 10 {
				at = append(at, fmt.Sprintf("+%.1f s", r.at.Sub(stopped).Seconds()))
			}
		}
		when = fmt.Sprintf("connections failed at %s from the stop, the host starting its apiserver from +%.1f s to +%.1f s; ",
			strings.Join(at, ", "), starting.Sub(stopped).Seconds(), started.Sub(stopped).Seconds())
	}
	start := time.Now()
	ip, err := b.control(ipvsvm.ActionCreate, url.Values{"name": {"after"}, "pod": {"2"}})
	if err != nil {
		return err
	}
	_, rerr := reachable(addr(ip, 80), time.Minute)
	converge := time.Since(start)
	b.row(faults.Row{Order: 10, Fault: fmt.Sprintf("API server stopped for %v", down),
		Action: "stop kube-apiserver with traffic to a cluster IP and a NodePort; start it; create a Service",
		Sent:   len(res), Failed: failures(res), Converge: faults.Seconds(converge) + " (new Service, from its creation)",
		Sees: fmt.Sprintf("%s/healthz %s during the outage; the daemon's TCP connections to it 2 s after it stopped: %s, a new one: %s; log: %q", when, formatCodes(seen), conns, dial,
			firstOf(d.logLine(offset, "connection refused"), d.logLine(offset, "Failed to watch"), d.logLine(offset, "^E"), "(nothing about it)"))})
	d.notes("the daemon's log during and after the outage", offset, `refused|backoff|Watch close|^[EW]|[Ww]atch|[Rr]eflector|Synced IPVS`)
	return errors.Join(rerr, d.alive("after the outage"), noFailures("while the apiserver was down", res),
		healthOnly200(seen), within("the new Service after the outage", converge, apiserverBackoff))
}

// apiserverBackoff bounds how long a change made once the apiserver is back may take to land in the VM
// (e2e/faults wants 2 s on the host). There, the apiserver refuses the daemon's new watches at once
// (qemu's user network refuses for the stopped port: client-go logs "Watch failed - backing off" at V(4)
// only); once it is back, they are refused as too old (410: the restarted apiserver's cache starts at a
// newer resource version), and client-go's reflector lists again only after its backoff (up to 30 s,
// jittered): 4-32 s measured (outages of 6 s to 2 min).
const apiserverBackoff = time.Minute

// stateRemoved clears every virtual server (ipvsadm -C) and flushes every ipset behind the daemon's back,
// then makes a connection every 20 ms until one succeeds.
func (b *fb) stateRemoved() error {
	d := b.d
	if _, err := reachable(b.targets[0], 10*time.Second); err != nil {
		return err
	}
	failuresBefore := metric("kubeproxy_sync_proxy_rules_failures_total", "")
	if err := sh("ipvsadm", "-C"); err != nil {
		return err
	}
	if err := sh("ipset", "flush"); err != nil {
		return err
	}
	start := time.Now()
	// What kube-proxy diff says meanwhile, in the background (it takes a while under TCG).
	drift := make(chan string, 1)
	go func() { drift <- diffSummary(b.p.Binary, b.p.Config) }()
	sent, failed, codes := 0, 0, map[int]int{}
	for {
		_, _, err := onceIn("client", "tcp", b.targets[0], 500*time.Millisecond)
		sent++
		if err == nil {
			break
		}
		failed++
		if failed%25 == 1 {
			codes[healthz()]++
		}
		if time.Since(start) > 3*b.sync+30*time.Second {
			return fmt.Errorf("web was still broken %v after its virtual servers were removed (%d connections)", time.Since(start), sent)
		}
		time.Sleep(20 * time.Millisecond)
	}
	converge := time.Since(start)
	diffSaid := <-drift
	b.row(faults.Row{Order: 20, Fault: "our rules removed by hand",
		Action: fmt.Sprintf("ipvsadm -C and ipset flush (syncPeriod %v), then a connection every 20 ms until one succeeds", b.sync),
		Sent:   sent, Failed: failed, Converge: faults.Seconds(converge) + " (found by the periodic full sync)",
		Sees: fmt.Sprintf("no metric counts it in mode ipvs (kubeproxy_sync_proxy_rules_failures_total +%v); /healthz %s while broken; kube-proxy diff meanwhile: %s",
			metric("kubeproxy_sync_proxy_rules_failures_total", "")-failuresBefore, formatCodes(codes), diffSaid)})
	return errors.Join(d.alive("after the repair"), within("the repair", converge, b.sync+10*time.Second))
}

// reload reloads an invalid configuration and one changing a restart-only field, with traffic flowing:
// both refused, the running configuration kept.
func (b *fb) reload() error {
	d := b.d
	good, err := os.ReadFile(b.p.Config)
	if err != nil {
		return err
	}
	defer os.WriteFile(b.p.Config, good, 0o600)
	var errs []error
	for i, c := range []struct{ fault, edit, result string }{
		{"an invalid config on reload", "a misspelt field (syncPeriood) in the file", "invalid"},
		{"a restart-only field changed on reload", "healthzBindAddress changed in the file", "restart-required"},
	} {
		tr := startTraffic(b.targets)
		tr.waitFor(20)
		body := string(good)
		if c.result == "invalid" {
			body += "syncPeriood: 1s\n"
		} else {
			body = strings.Replace(body, "127.0.0.1:10256", "127.0.0.1:10266", 1)
		}
		if err := os.WriteFile(b.p.Config, []byte(body), 0o600); err != nil {
			tr.stop()
			return err
		}
		label := fmt.Sprintf("result=%q", c.result)
		before := metric("kubeproxy_config_reloads_total", label)
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			tr.stop()
			return err
		}
		err := waitFor(30*time.Second, func() error {
			if metric("kubeproxy_config_reloads_total", label) > before {
				return nil
			}
			return errors.New("no reload outcome yet")
		})
		tr.waitFor(tr.count() + 20)
		res := tr.stop()
		if werr := os.WriteFile(b.p.Config, good, 0o600); werr != nil {
			return werr
		}
		code, herr := healthzErr("127.0.0.1:10256")
		// The STATUS line follows the metric; give it a moment under TCG.
		_ = waitFor(10*time.Second, func() error {
			if strings.Contains(d.status(), "last reload "+c.result) {
				return nil
			}
			return errors.New("not yet")
		})
		status := d.status()
		b.row(faults.Row{Order: 60 + i, Fault: c.fault,
			Action: c.edit + ", SIGHUP (systemctl reload) with traffic flowing",
			Sent:   len(res), Failed: failures(res), Converge: "nothing to converge: refused",
			Sees: fmt.Sprintf("kubeproxy_config_reloads_total{result=%q} +%v; STATUS %q; /healthz %d on the old address (%v)",
				c.result, metric("kubeproxy_config_reloads_total", label)-before, status, code, herr)})
		errs = append(errs, err, d.alive("after the reload"), noFailures(c.fault, res))
		if !strings.Contains(status, "last reload "+c.result) {
			errs = append(errs, fmt.Errorf("%s: STATUS %q does not say so", c.fault, status))
		}
	}
	return errors.Join(errs...)
}

// killDuringSync stops the daemon, has the host create a Service with many endpoints (so the next start's
// first sync is large), starts it once to time that sync, takes the virtual server that start wrote away,
// then kills a second start halfway through writing it again and starts a third, with traffic flowing to
// web all along.
func (b *fb) killDuringSync() error {
	b.d.stop()
	ip, err := b.control(ipvsvm.ActionCreateBig, url.Values{"name": {"big"}, "n": {strconv.Itoa(b.p.Big)}})
	if err != nil {
		return err
	}
	tr := startTraffic(b.targets)
	defer tr.stop()
	tr.waitFor(20)
	d1, err := b.start(b.p.Binary)
	if err != nil {
		return err
	}
	firstSync, err := d1.waitReady(5 * time.Minute)
	if err != nil {
		return err
	}
	// How long the first IPv4 sync took, from its log line.
	syncTook := firstSync
	if _, took, ok := d1.syncedAt(); ok {
		syncTook = took
	}
	d1.stop()
	// What d1 wrote for the big Service stays (a stop leaves the kernel as it is), so the next start
	// would find it done: take its virtual server away, and that start's first sync writes it again.
	if err := sh("ipvsadm", "-D", "-t", addr(ip, 80)); err != nil {
		return err
	}
	d2, err := b.start(b.p.Binary)
	if err != nil {
		return err
	}
	// Halfway: once half of the big Service's real servers are back in the kernel (timing from the
	// first start missed: the second one's sync ran at another speed under TCG).
	for deadline := time.Now().Add(2 * firstSync); time.Now().Before(deadline) && !d2.exited(); time.Sleep(20 * time.Millisecond) {
		if n, err := realServers(addr(ip, 80)); err == nil && n >= b.p.Big/2 {
			break
		}
	}
	syncedBeforeKill := d2.logLine(0, `Synced IPVS" ipFamily="IPv4"`) != ""
	_ = d2.cmd.Process.Signal(syscall.SIGKILL)
	<-d2.done
	killedAt := time.Now()
	left := "no virtual server for it"
	if n, err := realServers(addr(ip, 80)); err == nil {
		left = fmt.Sprintf("its virtual server with %d of %d real servers", n, b.p.Big)
	}
	d3, err := b.start(b.p.Binary)
	if err != nil {
		return err
	}
	if _, err := d3.waitReady(5 * time.Minute); err != nil {
		return err
	}
	converge := time.Since(killedAt)
	tr.waitFor(tr.count() + 20)
	res := tr.stop()
	reals, rerr := realServers(addr(ip, 80))
	drift := diffSummary(b.p.Binary, b.p.Config)
	killed := "during its first sync"
	if syncedBeforeKill {
		killed = "after its first sync had finished (the kill came too late)"
	}
	b.row(faults.Row{Order: 30, Fault: "kill -9 during a sync",
		Action: fmt.Sprintf("SIGKILL halfway through the first sync of a restart that adds a %d-endpoint Service (sync ≈ %v, READY=1 %v after the start; "+
			"a first start writes it, times it and stops, ipvsadm -D takes its virtual server away, the kill comes once half its real servers are back); start again",
			b.p.Big, syncTook.Round(100*time.Millisecond), firstSync.Round(100*time.Millisecond)),
		Sent: len(res), Failed: failures(res), Converge: faults.Seconds(converge) + " (restart to READY=1)",
		Sees: fmt.Sprintf("READY=1 of the new process after its first sync; killed %s, leaving %s; then the big Service's virtual server has %d real servers (want %d); kube-proxy diff: %s",
			killed, left, reals, b.p.Big, drift)})
	var errs []error
	errs = append(errs, rerr, noFailures("around the kill", res))
	if reals != b.p.Big {
		errs = append(errs, fmt.Errorf("the big Service has %d real servers, want %d", reals, b.p.Big))
	}
	if !strings.HasPrefix(drift, "no drift") {
		errs = append(errs, fmt.Errorf("kube-proxy diff after the restart: %s", drift))
	}
	return errors.Join(errs...)
}

// applyFailing runs the faults build, makes every apply fail for a while (KP_FAULT_FAIL_APPLY) with
// traffic flowing and a Service created halfway, then lets them succeed again.
func (b *fb) applyFailing() error {
	failFor := mustDuration(b.p.FailFor)
	b.d.stop()
	flag := "/tmp/kp-fail-apply"
	d, err := b.start(b.p.FaultsBinary, "KP_FAULT_FAIL_APPLY="+flag)
	if err != nil {
		return err
	}
	defer d.stop() // the next row gets the usual binary back
	if _, err := d.waitReady(3 * time.Minute); err != nil {
		return err
	}
	offset := d.logSize()
	o := observe(b.targets)
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		o.end()
		return err
	}
	defer os.Remove(flag)
	clock := func() string { return time.Now().Format("15:04:05.000") }
	logf("apply-failing: applies failing from %s", clock())
	time.Sleep(failFor / 2)
	ip, err := b.control(ipvsvm.ActionCreate, url.Values{"name": {"late"}, "pod": {"3"}})
	if err != nil {
		o.end()
		return err
	}
	logf("apply-failing: Service late created at %s", clock())
	time.Sleep(failFor / 2)
	status := d.status()
	if err := os.Remove(flag); err != nil {
		o.end()
		return err
	}
	logf("apply-failing: applies succeeding from %s", clock())
	converge, rerr := reachable(addr(ip, 80), time.Minute)
	logf("apply-failing: Service late answered at %s", clock())
	res, seen := o.end()
	b.row(faults.Row{Order: 50, Fault: fmt.Sprintf("every write of the rules failing for %v", failFor),
		Action: "the faults build's KP_FAULT_FAIL_APPLY fails every apply, with traffic flowing; a Service created halfway; then the failures stop",
		Sent:   len(res), Failed: failures(res), Converge: faults.Seconds(converge) + " (the waiting Service, from the recovery)",
		Sees: fmt.Sprintf("no restart; /healthz %s (503 only once the change had waited 2 × syncPeriod); kubeproxy_sync_proxy_rules_failures_total %v; STATUS %q",
			formatCodes(seen), metric("kubeproxy_sync_proxy_rules_failures_total", ""), status)})
	errs := []error{rerr, d.alive("after the failures"), noFailures("while applies failed", res)}
	if failures(res) > 0 {
		d.notes("the daemon's log while applies failed and after", offset, `Synced|^[EW]`)
	}
	if !strings.Contains(status, "sync failing") {
		errs = append(errs, fmt.Errorf("STATUS while applies failed: %q, want it to say so", status))
	}
	if seen[503] == 0 || seen[200] == 0 {
		errs = append(errs, fmt.Errorf("/healthz: %s, want 200 before the change and 503 once it waited", formatCodes(seen)))
	}
	return errors.Join(errs...)
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

// kp is one daemon process: its log in a file, its sd_notify messages on a socket of its own.
type kp struct {
	cmd     *exec.Cmd
	done    chan struct{}
	logPath string
	started time.Time
	sock    *net.UnixConn
	mu      sync.Mutex
	msgs    []string
	readyAt time.Time
}

// start starts binary (with extra environment) as the rows' daemon, at V(2).
func (b *fb) start(binary string, env ...string) (*kp, error) {
	b.started++
	n := b.started
	d := &kp{done: make(chan struct{}), logPath: fmt.Sprintf("/tmp/kp-%d.log", n)}
	sockPath := fmt.Sprintf("/run/kp-notify-%d.sock", n)
	_ = os.Remove(sockPath)
	sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockPath, Net: "unixgram"})
	if err != nil {
		return nil, err
	}
	d.sock = sock
	logFile, err := os.Create(d.logPath)
	if err != nil {
		sock.Close()
		return nil, err
	}
	d.cmd = exec.Command(binary, "--config", b.p.Config, "--v=2")
	d.cmd.Stdout, d.cmd.Stderr = logFile, logFile
	d.cmd.Env = append(os.Environ(), append([]string{"NOTIFY_SOCKET=" + sockPath}, env...)...)
	d.started = time.Now()
	if err := d.cmd.Start(); err != nil {
		logFile.Close()
		sock.Close()
		return nil, err
	}
	logFile.Close()
	go func() {
		buf := make([]byte, 8192)
		for {
			n, err := sock.Read(buf)
			if err != nil {
				return
			}
			msg := string(buf[:n])
			d.mu.Lock()
			d.msgs = append(d.msgs, msg)
			if d.readyAt.IsZero() && slices.Contains(strings.Split(msg, "\n"), "READY=1") {
				d.readyAt = time.Now()
			}
			d.mu.Unlock()
		}
	}()
	go func() {
		_ = d.cmd.Wait()
		close(d.done)
	}()
	b.d = d
	logf("daemon %d started: %s %v", n, binary, env)
	return d, nil
}

func (d *kp) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// waitReady waits for READY=1 and returns how long it came after the start.
func (d *kp) waitReady(limit time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(limit)
	for {
		d.mu.Lock()
		at := d.readyAt
		d.mu.Unlock()
		if !at.IsZero() {
			return at.Sub(d.started), nil
		}
		if d.exited() {
			return 0, fmt.Errorf("the daemon exited before READY=1: %s", d.tail(5))
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no READY=1 within %v: %s", limit, d.tail(5))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the daemon with SIGTERM (SIGKILL after 15 s); it is idempotent.
func (d *kp) stop() {
	if !d.exited() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(15 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	}
	d.sock.Close()
}

// alive says whether the daemon still runs.
func (d *kp) alive(when string) error {
	if d.exited() {
		return fmt.Errorf("%s: the daemon exited (%v): %s", when, d.cmd.ProcessState, d.tail(5))
	}
	return nil
}

// status returns the last STATUS= the daemon sent.
func (d *kp) status() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := ""
	for _, m := range d.msgs {
		for _, l := range strings.Split(m, "\n") {
			if s, ok := strings.CutPrefix(l, "STATUS="); ok {
				st = s
			}
		}
	}
	return st
}

func (d *kp) log() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

func (d *kp) logSize() int { return len(d.log()) }

// logLine returns the first line of the log (from offset bytes) matching re, without klog's header,
// shortened as e2e/faults does.
func (d *kp) logLine(offset int, re string) string {
	log := d.log()
	if offset > len(log) {
		offset = 0
	}
	m := strings.TrimSpace(regexp.MustCompile(`(?m)^.*(` + re + `).*$`).FindString(log[offset:]))
	if i := strings.Index(m, "] "); i >= 0 && i < 60 {
		m = m[i+2:]
	}
	if len(m) > 160 {
		m = m[:160] + "…"
	}
	return m
}

// syncedAt reads the first full IPv4 sync's log line: when it ended and how long it took.
func (d *kp) syncedAt() (time.Time, time.Duration, bool) {
	m := regexp.MustCompile(`(?m)^I(\d{4} \d\d:\d\d:\d\d\.\d+) .*"Synced IPVS" ipFamily="IPv4" full=true .*elapsed="([^"]+)"`).FindStringSubmatch(d.log())
	if m == nil {
		return time.Time{}, 0, false
	}
	t, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
	took, derr := time.ParseDuration(m[2])
	if err != nil || derr != nil {
		return time.Time{}, 0, false
	}
	t = t.AddDate(d.started.Year(), 0, 0)
	return t, took, true
}

// notes sends the daemon's log lines (from offset bytes) matching re to the host, 40 at most.
func (d *kp) notes(what string, offset int, re string) {
	log := d.log()
	if offset > len(log) {
		offset = 0
	}
	lines := regexp.MustCompile(`(?m)^.*(`+re+`).*$`).FindAllString(log[offset:], 40)
	report("NOTE", what+":\n"+strings.Join(lines, "\n"))
}

// tcpStates counts the VM's IPv4 TCP sockets connected to hostPort by state (/proc/net/tcp).
func tcpStates(hostPort string) map[string]int {
	out := map[string]int{}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return out
	}
	ip := net.ParseIP(host).To4()
	p, _ := strconv.Atoi(port)
	if ip == nil {
		return out
	}
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], p)
	names := map[string]string{"01": "ESTABLISHED", "02": "SYN_SENT", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
		"06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0B": "CLOSING"}
	b, _ := os.ReadFile("/proc/net/tcp")
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 3 && f[2] == want {
			out[firstOf(names[f[3]], f[3])]++
		}
	}
	return out
}

// apiserverAddr is the apiserver's host:port in the daemon's kubeconfig.
func apiserverAddr() (string, error) {
	b, err := os.ReadFile(ipvsvm.KubeconfigPath)
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`server: https://([^/\s]+)`).FindSubmatch(b)
	if m == nil {
		return "", errors.New("no server in the kubeconfig")
	}
	return string(m[1]), nil
}

func (d *kp) tail(n int) string {
	lines := strings.Split(strings.TrimRight(d.log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// dump copies the end of the daemon's log to the console.
func (d *kp) dump() {
	logf("daemon log %s (last 40 lines):\n%s", d.logPath, strings.ReplaceAll(d.tail(40), " | ", "\n"))
}

// result is one connection of the rows' traffic: "" or the error's class, with its text.
type result struct {
	err, detail string
	start, at   time.Time     // when it started and ended
	stalled     time.Duration // for a failed one, the longest stall of the guest while it lasted
}

// traffic makes new connections to the targets until stopped: 4 workers, each connection given 2 s
// (e2e/harness' StartTraffic, in the guest). Worker w connects to target w mod len(targets), from client
// namespace clientNS[w mod len(targets)]: each target from its own client address. From one address, the
// workers' concurrent connections to a cluster IP and a NodePort of the same pods now and then start at
// the same instant from the same port (a client picks its ports per destination), and the kernel's IPVS
// does not keep two such connections apart when they reach the same pod: one of them times out (the
// vip-port-reuse case; docs/DIFFERENCES.md). The rows measure the daemon, not that.
type traffic struct {
	mu       sync.Mutex
	res      []result
	stopping chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
	stalls   *stallWatch
}

// clientNS are the client namespaces the targets are reached from, by target index (see traffic).
var clientNS = []string{"client", "client2"}

func startTraffic(targets []string) *traffic {
	if len(targets) > len(clientNS) {
		panic("more targets than client namespaces")
	}
	tr := &traffic{stopping: make(chan struct{}), stalls: watchStalls()}
	for w := 0; w < 4; w++ {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			target := targets[w%len(targets)]
			_ = inNS(clientNS[w%len(targets)], func() error {
				for {
					select {
					case <-tr.stopping:
						return nil
					default:
					}
					start := time.Now()
					err := tracedOnce(target, 2*time.Second)
					r := result{start: start, at: time.Now()}
					if err != nil {
						r.err, r.detail = errClass(err), err.Error()
					}
					tr.mu.Lock()
					tr.res = append(tr.res, r)
					tr.mu.Unlock()
				}
			})
		}()
	}
	return tr
}

func (tr *traffic) count() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.res)
}

// waitFor waits (a minute at most) until n connections were made.
func (tr *traffic) waitFor(n int) {
	_ = waitFor(time.Minute, func() error {
		if tr.count() >= n {
			return nil
		}
		return errors.New("not yet")
	})
}

// stop ends the traffic once the connections under way are done and returns every result; idempotent.
func (tr *traffic) stop() []result {
	tr.once.Do(func() {
		close(tr.stopping)
		tr.wg.Wait()
		gaps := tr.stalls.stop()
		var longest stall
		for _, g := range gaps {
			if g.d > longest.d {
				longest = g
			}
		}
		logf("traffic: %d connections, %d failed; the guest's CPUs stalled ≥ %v %d times, longest %v (CPU %d, ended %s)",
			len(tr.res), failures(tr.res), stallMin, len(gaps), longest.d.Round(time.Millisecond), longest.cpu, longest.end.Format("15:04:05.000"))
		listed := 0
		for i, r := range tr.res {
			if r.err != "" {
				tr.res[i].stalled = longestStall(gaps, r.start, r.at)
				if listed++; listed <= 20 {
					logf("traffic: failed %s–%s (guest stalled %v meanwhile): %s", r.start.Format("15:04:05.000"),
						r.at.Format("15:04:05.000"), tr.res[i].stalled.Round(time.Millisecond), r.detail)
				}
			}
		}
	})
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.res
}

// tracedOnce is once over TCP; when the answer does not come, its error names the IPVS connection entries
// of the connection (what the kernel had made of it, read before it is closed).
func tracedOnce(target string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", target, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, _, err := greet(c, "tcp", timeout); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("%w (IPVS connection entries: %s)", err, ipvsConns(c.LocalAddr()))
		}
		return err
	}
	return nil
}

// ipvsConns returns the lines of the node's IPVS connection table (of PID 1's network namespace, the
// node's, whatever the caller's) whose client is local.
func ipvsConns(local net.Addr) string {
	a, ok := local.(*net.TCPAddr)
	if !ok || a.IP.To4() == nil {
		return "not an IPv4 TCP address"
	}
	ip := a.IP.To4()
	want := fmt.Sprintf("%02X%02X%02X%02X %04X ", ip[0], ip[1], ip[2], ip[3], a.Port)
	b, err := os.ReadFile("/proc/1/net/ip_vs_conn")
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, want) {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	if len(out) == 0 {
		return "none for " + local.String()
	}
	return strings.Join(out, " / ")
}

// stallWatch tells when the guest's CPUs did not run: a goroutine per CPU, its thread pinned there, sleeps
// stallTick at a time and records each wake-up later than stallMin. Under emulation each virtual CPU is a
// host thread, and when the host's own cores are busy it may not run for a while: a connection that lasted
// through such a stall lost that much of its time, whatever the dataplane did.
type stallWatch struct {
	mu   sync.Mutex
	gaps []stall
	done chan struct{}
	wg   sync.WaitGroup
}

// stall is a period in which a CPU's watching goroutine did not run, beyond its tick.
type stall struct {
	cpu int
	end time.Time
	d   time.Duration
}

const (
	stallTick = 10 * time.Millisecond
	stallMin  = 100 * time.Millisecond
)

func watchStalls() *stallWatch {
	w := &stallWatch{done: make(chan struct{})}
	for cpu := 0; cpu < runtime.NumCPU(); cpu++ {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			runtime.LockOSThread() // the thread ends with the goroutine, its affinity with it
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				logf("stall watch: pinning to CPU %d: %v", cpu, err)
				return
			}
			last := time.Now()
			for {
				select {
				case <-w.done:
					return
				case <-time.After(stallTick):
				}
				now := time.Now()
				if late := now.Sub(last) - stallTick; late >= stallMin {
					w.mu.Lock()
					w.gaps = append(w.gaps, stall{cpu: cpu, end: now, d: late})
					w.mu.Unlock()
				}
				last = now
			}
		}()
	}
	return w
}

// stop ends the watch and returns the stalls seen.
func (w *stallWatch) stop() []stall {
	close(w.done)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gaps
}

// longestStall returns the longest part of a stall that lay within [from, to].
func longestStall(gaps []stall, from, to time.Time) time.Duration {
	var longest time.Duration
	for _, g := range gaps {
		start, end := g.end.Add(-g.d), g.end
		if start.Before(from) {
			start = from
		}
		if end.After(to) {
			end = to
		}
		if d := end.Sub(start); d > longest {
			longest = d
		}
	}
	return longest
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

func healthOnly200(seen map[int]int) error {
	if len(seen) != 1 || seen[200] == 0 {
		return fmt.Errorf("/healthz during the outage: %s, want 200 only (nothing was queued)", formatCodes(seen))
	}
	return nil
}

// observation is traffic plus /healthz polled every second.
type observation struct {
	tr    *traffic
	stop  chan struct{}
	codes chan map[int]int
}

func observe(targets []string) *observation {
	o := &observation{tr: startTraffic(targets), stop: make(chan struct{}), codes: make(chan map[int]int, 1)}
	o.tr.waitFor(20)
	go func() {
		codes := map[int]int{}
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			codes[healthz()]++
			select {
			case <-o.stop:
				o.codes <- codes
				return
			case <-tick.C:
			}
		}
	}()
	return o
}

func (o *observation) end() ([]result, map[int]int) {
	close(o.stop)
	codes := <-o.codes
	return o.tr.stop(), codes
}

// healthz returns the daemon's /healthz code, -1 for no answer.
func healthz() int {
	code, err := healthzErr("127.0.0.1:10256")
	if err != nil {
		return -1
	}
	return code
}

func healthzErr(hostPort string) (int, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + hostPort + "/healthz")
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// formatCodes shows health codes as e2e/faults does: "200 ×12, 503 ×3".
func formatCodes(codes map[int]int) string {
	var parts []string
	for _, c := range []int{200, 503, -1} {
		if n := codes[c]; n > 0 {
			name := fmt.Sprint(c)
			if c == -1 {
				name = "no answer"
			}
			parts = append(parts, fmt.Sprintf("%s ×%d", name, n))
		}
	}
	if len(parts) == 0 {
		return "not asked"
	}
	return strings.Join(parts, ", ")
}

// metric sums the samples of a metric of the daemon's /metrics whose labels contain label ("" for all).
func metric(name, label string) float64 {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://127.0.0.1:10249/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		if label != "" && !strings.Contains(l, label) {
			continue
		}
		if v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// reachable polls addr from the client until one connection succeeds and says how long that took.
func reachable(target string, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		if _, _, err := onceIn("client", "tcp", target, 500*time.Millisecond); err == nil {
			return time.Since(start), nil
		} else if time.Since(start) > limit {
			return time.Since(start), fmt.Errorf("%s not reachable within %v: %v", target, limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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

// realServers counts the real servers of a TCP virtual server (ipvsadm -Ln -t).
func realServers(vs string) (int, error) {
	out, err := shOut("ipvsadm", "-Ln", "-t", vs)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "->" && f[1] != "RemoteAddress:Port" {
			n++
		}
	}
	return n, nil
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
