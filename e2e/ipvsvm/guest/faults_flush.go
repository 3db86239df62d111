//go:build linux

package main

import (
	"errors"
	"fmt"
	"time"

	"kube-proxy/e2e/faults"
)

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
