package harness_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"kube-proxy/e2e/harness"
)

func TestProcessNotifySocketAcrossNamespaces(t *testing.T) {
	harness.Require(t)
	noNamespacesLeft(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	sock, err := harness.NewNotifySocket(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	ns := harness.NetNSForTest(t, "notify")

	cmd := ns.Command(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"=notify", sock.Env())
	p, err := harness.StartProcess("notify-helper", cmd, dir+"/helper.log")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(syscall.SIGKILL, time.Second) })
	if err := sock.WaitFor(ctx, "READY=1"); err != nil {
		t.Fatalf("%v\nlog:\n%s", err, p.Log())
	}
	if err := sock.WaitFor(ctx, "WATCHDOG=1"); err != nil {
		t.Fatal(err)
	}
	for _, m := range sock.Received() {
		if m.PID != p.PID() {
			t.Errorf("message %q from pid %d, want the daemon's %d", m.Text, m.PID, p.PID())
		}
	}
	if msgs := sock.Messages(); len(msgs) == 0 || !strings.Contains(msgs[0], "STATUS=serving") {
		t.Errorf("first datagram = %q, want READY=1 with STATUS=serving", msgs)
	}

	mark := len(sock.Lines())
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	reload, err := sock.WaitForLine(ctx, mark, func(l string) bool { return l == "RELOADING=1" })
	if err != nil {
		t.Fatalf("no RELOADING=1 after SIGHUP: %v (lines %q)", err, sock.Lines())
	}
	if _, err := sock.WaitForLine(ctx, reload+1, func(l string) bool { return l == "READY=1" }); err != nil {
		t.Fatalf("no READY=1 after RELOADING=1: %v", err)
	}

	mark = len(sock.Lines())
	if err := p.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("stopping helper: %v", err)
	}
	if err := p.ExitErr(); err != nil {
		t.Errorf("helper exit: %v", err)
	}
	if _, err := sock.WaitForLine(ctx, mark, func(l string) bool { return l == "STOPPING=1" }); err != nil {
		t.Errorf("no STOPPING=1 after SIGTERM: %v", err)
	}
	if log := p.Log(); !strings.Contains(log, "helper up") || !strings.Contains(log, "helper stopping") {
		t.Errorf("helper log lacks its output:\n%s", log)
	}
	if err := p.Stop(syscall.SIGTERM, time.Second); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestProcessStopKillsAfterTimeout(t *testing.T) {
	harness.Require(t)
	cmd := newHelperCmd("ignore-term")
	p, err := harness.StartProcess("stubborn", cmd, t.TempDir()+"/stubborn.log")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.Log(), "ignoring SIGTERM") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	err = p.Stop(syscall.SIGTERM, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Stop of a process ignoring SIGTERM: err = %v, want it killed", err)
	}
	if !p.Exited() {
		t.Error("process still running after Stop")
	}
}

func newHelperCmd(mode string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"="+mode)
	return cmd
}
