package netnstest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/xtables"
)

var seq atomic.Uint64

// Backends are the iptables variants tested.
var Backends = []string{"nft", "legacy"}

// NS is a network namespace created for one test.
type NS struct {
	Name string
}

// Enabled reports whether kernel tests should run: KP_E2E is set. Require fails the test when they should
// but cannot.
func Enabled() bool { return os.Getenv("KP_E2E") != "" }

// New creates a network namespace removed when the test ends. It skips the test unless KP_E2E is set, and
// fails it when KP_E2E is set but the namespace cannot be made (not root, no ip(8)).
func New(t testing.TB) *NS {
	t.Helper()
	if !Enabled() {
		t.Skip("kernel test: set KP_E2E=1 and run as root")
	}
	if os.Geteuid() != 0 {
		t.Fatal("KP_E2E is set but the test does not run as root")
	}
	name := fmt.Sprintf("kpit-%d-%d", os.Getpid(), seq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("creating network namespace %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("deleting network namespace %s: %v: %s", name, err, out)
		}
	})
	return &NS{Name: name}
}

// Binary returns the iptables command for a backend ("nft" or "legacy"), family and tool ("restore",
// "save" or "" for iptables itself), e.g. ip6tables-legacy-restore.
func Binary(backend string, ipv6 bool, tool string) string {
	family := v1.IPv4Protocol
	if ipv6 {
		family = v1.IPv6Protocol
	}
	return xtables.Command(xtables.Backend(backend), family, tool)
}

// Check fails the test if a backend's binaries are missing.
func Check(t testing.TB, backend string, ipv6 bool) {
	t.Helper()
	for _, tool := range []string{"restore", "save"} {
		if _, err := exec.LookPath(Binary(backend, ipv6, tool)); err != nil {
			t.Fatalf("%s not found: %v", Binary(backend, ipv6, tool), err)
		}
	}
}

// Restore runs `iptables-restore args...` in the namespace with payload on stdin.
func (ns *NS) Restore(backend string, ipv6 bool, payload []byte, args ...string) error {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name, Binary(backend, ipv6, "restore")}, args...)...)
	cmd.Stdin = bytes.NewReader(payload)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", Binary(backend, ipv6, "restore"), strings.Join(args, " "), err, out.String())
	}
	return nil
}

// Save returns `iptables-save -t table` from the namespace without its "#" lines.
func (ns *NS) Save(backend string, ipv6 bool, table string) (string, error) {
	out, err := exec.Command("ip", "netns", "exec", ns.Name, Binary(backend, ipv6, "save"), "-t", table).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s -t %s: %v: %s", Binary(backend, ipv6, "save"), table, err, out)
	}
	var b strings.Builder
	for _, l := range strings.SplitAfter(string(out), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			b.WriteString(l)
		}
	}
	return b.String(), nil
}

// Exec runs a command inside the namespace with stdin (nil for none) and returns its standard output; a
// failure carries the standard error too.
func (ns *NS) Exec(stdin []byte, name string, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name, name}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// File opens the namespace (for netlink sockets opened in it by file descriptor); it is closed when the
// test ends.
func (ns *NS) File(t testing.TB) *os.File {
	t.Helper()
	f, err := os.Open("/var/run/netns/" + ns.Name)
	if err != nil {
		t.Fatalf("opening network namespace %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// Do runs fn on an OS thread that has entered the namespace, so that the sockets fn opens belong to it,
// and returns fn's error. The thread is never used again: it ends with the goroutine that ran fn.
func (ns *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		h, err := netns.GetFromName(ns.Name)
		if err != nil {
			errc <- fmt.Errorf("opening network namespace %s: %w", ns.Name, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("entering network namespace %s: %w", ns.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
