package systemd

import (
	"context"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"kube-proxy/config"
)

// notifySocket listens on a real unix datagram socket, as systemd does, and returns received messages.
func notifySocket(t *testing.T) (path string, recv func() string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return path, func() string {
		buf := make([]byte, 4096)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no notify message: %v", err)
		}
		return string(buf[:n])
	}
}

func TestNotifierMessages(t *testing.T) {
	_, recv := notifySocket(t)
	n := NewNotifier()

	n.Ready("Proxying 3 service ports")
	if got := recv(); got != "READY=1\nSTATUS=Proxying 3 service ports" {
		t.Errorf("Ready sent %q", got)
	}
	n.Reloading()
	got := recv()
	if !strings.HasPrefix(got, "RELOADING=1\nMONOTONIC_USEC=") {
		t.Errorf("Reloading sent %q", got)
	}
	n.Stopping()
	if got := recv(); !strings.HasPrefix(got, "STOPPING=1") {
		t.Errorf("Stopping sent %q", got)
	}
}

func TestNotifierWithoutSocketIsNoop(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n := NewNotifier()
	n.Ready("x") // must not fail or block
	n.Stopping()
}

func TestWatchdogPingsOnlyWhileHealthy(t *testing.T) {
	n := NewNotifier()
	var healthy atomic.Bool
	healthy.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var pings atomic.Int32
	n.notify = func(state string) (bool, error) {
		if state == "WATCHDOG=1" {
			pings.Add(1)
		}
		return true, nil
	}
	go n.watchdogLoop(ctx, 5*time.Millisecond, healthy.Load)
	waitFor(t, func() bool { return pings.Load() >= 3 })
	healthy.Store(false)
	time.Sleep(20 * time.Millisecond) // let an in-flight ping land
	before := pings.Load()
	time.Sleep(50 * time.Millisecond)
	if after := pings.Load(); after != before {
		t.Errorf("watchdog pinged %d times while unhealthy", after-before)
	}
	healthy.Store(true)
	waitFor(t, func() bool { return pings.Load() > before })
}

func TestWatchdogDisabledReturns(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "")
	done := make(chan struct{})
	go func() { NewNotifier().Watchdog(context.Background(), func() bool { return true }); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Watchdog did not return without WATCHDOG_USEC")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestReloadHandshake(t *testing.T) {
	dir := t.TempDir()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	// A stand-in daemon: answers each SIGHUP with the next generation, the first applied, the second invalid.
	go func() {
		for gen := uint64(1); gen <= 2; gen++ {
			<-hup
			time.Sleep(30 * time.Millisecond) // the daemon takes a while; the helper must wait for it
			res := config.ReloadApplied
			if gen == 2 {
				res = config.ReloadInvalid
			}
			if err := WriteReloadStatus(dir, config.ReloadResult{Generation: gen, Result: res, Message: "line 3: bad"}); err != nil {
				t.Error(err)
			}
		}
	}()
	if err := ReloadAndWait(os.Getpid(), dir, 5*time.Second); err != nil {
		t.Fatalf("first reload: %v", err)
	}
	st, err := ReadReloadStatus(dir)
	if err != nil || st.Generation != 1 {
		t.Fatalf("status after first reload: %+v %v", st, err)
	}
	err = ReloadAndWait(os.Getpid(), dir, 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "line 3: bad") {
		t.Fatalf("second reload should report the invalid config, got %v", err)
	}
}

func TestReloadTimesOut(t *testing.T) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	err := ReloadAndWait(os.Getpid(), t.TempDir(), 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not finish") {
		t.Fatalf("want a timeout, got %v", err)
	}
}

func TestReloadStatusRoundTripAndReset(t *testing.T) {
	dir := t.TempDir()
	if st, err := ReadReloadStatus(dir); err != nil || st.Generation != 0 {
		t.Fatalf("empty dir: %+v %v", st, err)
	}
	want := config.ReloadResult{Generation: 7, Result: config.ReloadRestartRequired, Message: "changed fields need a restart: mode"}
	if err := WriteReloadStatus(dir, want); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadReloadStatus(dir); err != nil || got != want {
		t.Fatalf("got %+v %v, want %+v", got, err, want)
	}
	if err := ResetReloadStatus(dir); err != nil {
		t.Fatal(err)
	}
	if st, _ := ReadReloadStatus(dir); st.Generation != 0 {
		t.Fatalf("reset left %+v", st)
	}
	// A missing runtime directory (not under systemd) is not an error.
	if err := WriteReloadStatus(filepath.Join(dir, "absent"), want); err != nil {
		t.Fatal(err)
	}
}

// TestReloadNeverReportsAnEarlierReload: a helper that gave up on a slow reload leaves that reload running;
// the next helper must get the outcome of a reload that started after it asked, not the slow one's.
func TestReloadNeverReportsAnEarlierReload(t *testing.T) {
	dir := t.TempDir()
	if err := ResetReloadStatus(dir); err != nil {
		t.Fatal(err)
	}
	hup := make(chan os.Signal, 2)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	slowTaken, release := make(chan struct{}), make(chan struct{})
	daemonDone := make(chan struct{})
	// A stand-in daemon, reloading as lifecycle.reload does: the first reload is slow and finds the file
	// invalid; the second applies.
	go func() {
		defer close(daemonDone)
		for gen := uint64(1); gen <= 2; gen++ {
			<-hup
			ids := TakeReloadRequests(dir)
			st := config.ReloadResult{Generation: gen, Result: config.ReloadApplied}
			if gen == 1 {
				close(slowTaken)
				<-release
				st.Result, st.Message = config.ReloadInvalid, "line 3: an old mistake"
			}
			if err := WriteReloadStatus(dir, st); err != nil {
				t.Error(err)
			}
			if err := AnswerReloadRequests(dir, ids, st); err != nil {
				t.Error(err)
			}
			time.Sleep(100 * time.Millisecond) // between reloads, the outcome is there to be read
		}
	}()
	err := ReloadAndWait(os.Getpid(), dir, 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not finish") {
		t.Fatalf("the slow reload: %v, want a timeout", err)
	}
	<-slowTaken
	second := make(chan error, 1)
	go func() { second <- ReloadAndWait(os.Getpid(), dir, 5*time.Second) }()
	time.Sleep(50 * time.Millisecond) // the second helper waits while the slow reload ends
	close(release)
	if err := <-second; err != nil {
		t.Errorf("the second reload reported %v; want its own outcome (applied), not the earlier reload's", err)
	}
	<-daemonDone
	entries, _ := os.ReadDir(filepath.Join(dir, reloadRequestsDir))
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), doneSuffix) {
			t.Errorf("request %s left behind", e.Name())
		}
	}
}
