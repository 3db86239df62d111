//go:build linux

package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"kube-proxy/e2e/faults"
)

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
