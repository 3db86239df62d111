//go:build linux

package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"kube-proxy/e2e/probe"
)

// kp is one daemon process: its log in a file, its sd_notify messages on a socket of its own.
type kp struct {
	proc    *probe.Process
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
	d := &kp{proc: probe.NewProcess(fmt.Sprintf("daemon %d", n), fmt.Sprintf("/tmp/kp-%d.log", n))}
	sockPath := fmt.Sprintf("/run/kp-notify-%d.sock", n)
	_ = os.Remove(sockPath)
	sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockPath, Net: "unixgram"})
	if err != nil {
		return nil, err
	}
	d.sock = sock
	cmd := exec.Command(binary, "--config", b.p.Config, "--v=2")
	cmd.Env = append(os.Environ(), append([]string{"NOTIFY_SOCKET=" + sockPath}, env...)...)
	// As before, neither a process group of its own nor a parent-death signal (probe.Process' defaults
	// otherwise): the signal follows the starting thread, and the agent's namespace threads (inNS) may end.
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	d.started = time.Now()
	if err := d.proc.Start(cmd); err != nil {
		sock.Close()
		return nil, err
	}
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
	b.d = d
	logf("daemon %d started: %s %v", n, binary, env)
	return d, nil
}

func (d *kp) exited() bool { return d.proc.Exited() }

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
	_ = d.proc.Stop(syscall.SIGTERM, 15*time.Second)
	d.sock.Close()
}

// alive says whether the daemon still runs.
func (d *kp) alive(when string) error {
	if d.exited() {
		return fmt.Errorf("%s: the daemon exited (%s): %s", when, exitStatus(d.proc.ExitErr()), d.tail(5))
	}
	return nil
}

// exitStatus shows how an exited process ended, as its os.ProcessState does ("exit status 1",
// "signal: killed").
func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// status returns the last STATUS= the daemon sent.
func (d *kp) status() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return probe.LastStatus(d.msgs)
}

func (d *kp) log() string {
	b, _ := os.ReadFile(d.proc.LogPath)
	return string(b)
}

func (d *kp) logSize() int { return len(d.log()) }

// logLine returns the first line of the log (from offset bytes) matching re, without klog's header,
// shortened as e2e/faults does (probe.LogLine).
func (d *kp) logLine(offset int, re string) string { return probe.LogLine(d.log(), offset, re) }

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

func (d *kp) tail(n int) string { return strings.ReplaceAll(d.proc.LogTail(n), "\n", " | ") }

// dump copies the end of the daemon's log to the console.
func (d *kp) dump() {
	logf("daemon log %s (last 40 lines):\n%s", d.proc.LogPath, strings.ReplaceAll(d.tail(40), " | ", "\n"))
}
