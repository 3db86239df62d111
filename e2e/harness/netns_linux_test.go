package harness_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"kube-proxy/e2e/harness"
)

func TestNetNSDo(t *testing.T) {
	harness.Require(t)
	noNamespacesLeft(t)
	ns := harness.NetNSForTest(t, "do")
	inode := func(path string) uint64 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			t.Fatalf("stat %s: %v", path, err)
		}
		return st.Ino
	}
	want := inode(ns.Path())
	var inside uint64
	if err := ns.Do(func() error { inside = inode("/proc/thread-self/ns/net"); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside != want {
		t.Errorf("inside Do the thread's netns inode is %d, want %d", inside, want)
	}
	// Afterwards no goroutine of ours is left in the namespace: run many and check.
	for range 20 {
		done := make(chan uint64)
		go func() { done <- inode("/proc/thread-self/ns/net") }()
		if got := <-done; got == want {
			t.Fatal("a goroutine ran in the test namespace after Do returned")
		}
	}

	// Listen / DialContext / HTTPClient inside the namespace.
	l, err := ns.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go serveHello(l)
	resp, err := ns.HTTPClient().Get("http://" + l.Addr().String() + "/metrics")
	if err != nil {
		t.Fatalf("HTTP GET inside the namespace: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
	out, err := ns.Run(context.Background(), "ip", "-o", "link", "show", "lo")
	if err != nil || !strings.Contains(out, "UP") {
		t.Errorf("lo in %s not up (err %v): %s", ns.Name, err, out)
	}
}

func serveHello(l net.Listener) {
	_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("hello\n")) }))
}
