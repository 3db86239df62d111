package probe

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestTail(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc"},
		{"a\nb", 5, "a\nb"},
		{"", 3, ""},
		{strings.Repeat("x\n", 100) + "y\nz\n", 2, "y\nz"},
	}
	for _, tt := range tests {
		if got := Tail(tt.in, tt.n); got != tt.want {
			t.Errorf("Tail(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

// waitLog waits (5 s at most) until p's log contains s.
func waitLog(t *testing.T, p *Process, s string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(p.Log(), s); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never wrote %q; log: %q", p.Name, s, p.Log())
		}
	}
}

func TestProcessStartStop(t *testing.T) {
	p, err := StartProcess("sleeper", exec.Command("sh", "-c", "echo started; exec sleep 30"), t.TempDir()+"/sleeper.log")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(syscall.SIGKILL, time.Second) })
	if p.PID() == 0 || p.Exited() {
		t.Fatalf("after Start: pid %d, exited %v", p.PID(), p.Exited())
	}
	waitLog(t, p, "started")
	if err := p.Start(exec.Command("true")); err == nil {
		t.Error("a second Start did not fail")
	}
	if err := p.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if !p.Exited() || p.ExitErr() == nil {
		t.Errorf("after SIGTERM: exited %v, %v; want exited by the signal", p.Exited(), p.ExitErr())
	}
	if err := p.Stop(syscall.SIGTERM, time.Second); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
	if err := p.Signal(syscall.SIGHUP); err == nil {
		t.Error("Signal to an exited process did not fail")
	}
	if got := p.LogTail(1); got != "started" {
		t.Errorf("LogTail(1) = %q", got)
	}
}

func TestProcessStopKills(t *testing.T) {
	p, err := StartProcess("stubborn", exec.Command("sh", "-c", `trap "" TERM; echo ready; while :; do sleep 0.05; done`), t.TempDir()+"/stubborn.log")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(syscall.SIGKILL, time.Second) })
	waitLog(t, p, "ready")
	if err := p.Stop(syscall.SIGTERM, 200*time.Millisecond); err == nil || !p.Exited() {
		t.Errorf("Stop of a process ignoring SIGTERM: %v, exited %v; want it killed, with an error", err, p.Exited())
	}
}

// TestProcessEcho: with Echo set, the output goes to the log and, line by line with a prefix, to Echo.
func TestProcessEcho(t *testing.T) {
	var console strings.Builder
	p := NewProcess("echoer", t.TempDir()+"/echoer.log")
	p.Echo = PrefixLines(&console, "echoer")
	if err := p.Start(exec.Command("sh", "-c", "printf 'one\\ntw'; sleep 0.1; printf 'o\\nthree\\n'")); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := console.String(), "echoer: one\nechoer: two\nechoer: three\n"; got != want {
		t.Errorf("echoed %q, want %q", got, want)
	}
	if got := p.Log(); got != "one\ntwo\nthree\n" {
		t.Errorf("log %q", got)
	}
}
