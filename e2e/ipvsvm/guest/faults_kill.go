//go:build linux

package main

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kube-proxy/e2e/faults"
	"kube-proxy/e2e/ipvsvm"
)

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
	_ = d2.proc.Signal(syscall.SIGKILL)
	<-d2.proc.Done()
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
