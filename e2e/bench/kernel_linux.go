package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"kube-proxy/e2e/harness"
)

// restoreTool is the iptables-restore both implementations end up running: iptables-nft (the host's
// default, and the backend the node's KUBE-IPTABLES-HINT chain points ours to).
const (
	restoreTool = "iptables-nft-restore"
	saveTool    = "iptables-nft-save"
)

// restoreResult is one timed iptables-restore (or nft -f).
type restoreResult struct {
	// Wall is exec → exit. Commit is exec → its last nf_tables transaction as the monitor saw it (0
	// without a monitor): the rules are in effect from then on, while the process still takes ~10 ms to
	// exit on this kernel (closing its netlink socket). The monitor reads the commit a scheduling delay
	// late, so on a busy host Commit can exceed Wall by a millisecond or so.
	Wall, Commit, User, Sys time.Duration
}

// sample is the result's commit and exit times.
func (r restoreResult) sample() FloorSample { return FloorSample{Commit: r.Commit, Wall: r.Wall} }

// restore runs `iptables-nft-restore -w [--noflush]` with payload on stdin directly inside ns (forked from
// a thread in the namespace, without `ip netns exec`, as a daemon running there would) and times it. With
// mon (listening in ns) it also times the commit.
func restore(ns *harness.NetNS, payload []byte, noflush bool, mon *Monitor) (restoreResult, error) {
	args := []string{"-w"}
	if noflush {
		args = append(args, "--noflush")
	}
	// One transaction per table (COMMIT line).
	return timedRun(ns, mon, payload, bytes.Count(payload, []byte("\nCOMMIT\n")), 0, restoreTool, args...)
}

// nftRun runs `nft -f -` with text on stdin inside ns, as restore does: one transaction. With a timeout,
// an nft still running then is killed and the error is errNotInTime.
func nftRun(ns *harness.NetNS, text string, mon *Monitor, timeout time.Duration) (restoreResult, error) {
	return timedRun(ns, mon, []byte(text), 1, timeout, "nft", "-f", "-")
}

// timedRun runs tool with args and stdin inside ns and times it; with mon it also times its last
// transaction of the want it commits (seen within 2 s of its exit). A tool still running after timeout
// (if not 0) is killed.
func timedRun(ns *harness.NetNS, mon *Monitor, stdin []byte, want int, timeout time.Duration, tool string, args ...string) (restoreResult, error) {
	var res restoreResult
	var start time.Time
	var pid int
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	err := ns.Do(func() error {
		cmd := exec.CommandContext(ctx, tool, args...)
		cmd.Stdin = bytes.NewReader(stdin)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start = time.Now()
		err := cmd.Start()
		if err == nil {
			pid = cmd.Process.Pid
			err = cmd.Wait()
		}
		res.Wall = time.Since(start)
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w (%v)", tool, strings.Join(args, " "), errNotInTime, timeout)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
		}
		res.User, res.Sys = cmd.ProcessState.UserTime(), cmd.ProcessState.SystemTime()
		return nil
	})
	if err != nil || mon == nil {
		return res, err
	}
	// The monitor may still be reading the last transactions.
	deadline := time.Now().Add(2 * time.Second)
	for {
		var seen int
		var last time.Time
		for _, g := range mon.GensSince(start) {
			if g.PID == pid {
				seen, last = seen+1, g.Time
			}
		}
		if seen >= want || (seen > 0 && time.Now().After(deadline)) {
			res.Commit = last.Sub(start)
			return res, nil
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("the monitor saw no transaction of %s (pid %d)", tool, pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// save returns `iptables-nft-save [-t table]` (IPv4) of ns; table "" saves every table.
func save(ns *harness.NetNS, table string) (string, error) {
	var out, errb bytes.Buffer
	var args []string
	if table != "" {
		args = []string{"-t", table}
	}
	err := ns.Do(func() error {
		cmd := exec.Command(saveTool, args...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w: %s", saveTool, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
		}
		return nil
	})
	return out.String(), err
}

// nftList returns `nft list table ip kube-proxy` of ns.
func nftList(ns *harness.NetNS) (string, error) {
	var out, errb bytes.Buffer
	err := ns.Do(func() error {
		cmd := exec.Command("nft", "list", "table", "ip", nftTable)
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("nft list table ip %s: %w: %s", nftTable, err, strings.TrimSpace(errb.String()))
		}
		return nil
	})
	return out.String(), err
}
