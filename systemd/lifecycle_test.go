package systemd

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"kube-proxy/config"
)

// TestStatusKeepsTheLastRefusedReload: after a refused reload, every refresh of the STATUS line still says
// so (the running configuration is not the file's) until a reload is applied.
func TestStatusKeepsTheLastRefusedReload(t *testing.T) {
	_, recv := notifySocket(t)
	t.Setenv("RUNTIME_DIRECTORY", t.TempDir())
	t.Setenv("WATCHDOG_USEC", "")
	old := statusEvery
	statusEvery = 20 * time.Millisecond
	defer func() { statusEvery = old }()

	ready := make(chan struct{})
	close(ready)
	results := make(chan config.ReloadResult, 2)
	results <- config.ReloadResult{Generation: 1, Result: config.ReloadInvalid, Message: "config.yaml:3: syncPeriood: unknown field"}
	results <- config.ReloadResult{Generation: 2, Result: config.ReloadApplied}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, NewNotifier(), Hooks{
			Ready:  ready,
			Reload: func(context.Context) config.ReloadResult { return <-results },
			Alive:  func() bool { return true },
			Status: func() string { return "Proxying 3 service ports" },
		})
	}()
	defer func() {
		cancel()
		<-done
	}()

	// next returns the next message that carries a STATUS line, skipping RELOADING=1's.
	next := func() string {
		for {
			m := recv()
			if !strings.Contains(m, "RELOADING=1") {
				return m
			}
		}
	}
	for m := next(); !strings.HasPrefix(m, "READY=1"); m = next() {
		if m != "STATUS=Proxying 3 service ports" {
			t.Fatalf("before READY=1: %q", m)
		}
	}
	const note = "(last reload invalid: config.yaml:3: syncPeriood: unknown field)"
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// READY=1 after the reload, then refreshes: all of them carry the note.
	sawReady, refreshes := false, 0
	for refreshes < 3 {
		m := next()
		if !strings.HasSuffix(m, note) {
			if !sawReady {
				continue // a refresh sent before the reload
			}
			t.Fatalf("after the refused reload: %q, want it to end with %q", m, note)
		}
		if strings.HasPrefix(m, "READY=1") {
			sawReady = true
		} else if sawReady {
			refreshes++
		}
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for {
		m := next()
		if strings.HasPrefix(m, "READY=1") {
			if strings.Contains(m, "last reload") {
				t.Fatalf("after the applied reload: %q, want no note", m)
			}
			break
		}
	}
	if m := next(); m != "STATUS=Proxying 3 service ports" {
		t.Errorf("refresh after the applied reload: %q", m)
	}
}
