//go:build linux

package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"kube-proxy/e2e/faults"
	"kube-proxy/e2e/ipvsvm"
)

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
