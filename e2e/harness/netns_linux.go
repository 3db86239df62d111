package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// NetNSPrefix starts the name of every network namespace the harness creates.
const NetNSPrefix = "kpt-"

// netnsRunDir is where `ip netns` keeps its namespace handles.
const netnsRunDir = "/run/netns"

// NetNS is a named network namespace created with `ip netns add`. Its name is
// "kpt-<label>-<pid of the creating process>-<random>", so concurrent tests never collide and
// RemoveStaleNetNS can tell namespaces whose creator died.
type NetNS struct {
	// Name is the namespace's name for `ip netns` / `ip -n`.
	Name string

	mu      sync.Mutex
	cmds    []*exec.Cmd
	deleted bool
}

var labelRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,30}$`)

// NewNetNS creates a network namespace whose name contains label (lower-case letters, digits and
// dashes) and brings its loopback up.
func NewNetNS(label string) (*NetNS, error) {
	if !labelRE.MatchString(label) {
		return nil, fmt.Errorf("network namespace label %q: want [a-z0-9][a-z0-9-]{0,30}", label)
	}
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("naming network namespace: %w", err)
	}
	n := &NetNS{Name: fmt.Sprintf("%s%s-%d-%s", NetNSPrefix, label, os.Getpid(), hex.EncodeToString(rnd[:]))}
	if out, err := exec.Command("ip", "netns", "add", n.Name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %w: %s", n.Name, err, strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("ip", "-n", n.Name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return nil, errors.Join(fmt.Errorf("bringing lo up in %s: %w: %s", n.Name, err, strings.TrimSpace(string(out))), n.Delete())
	}
	return n, nil
}

// Path returns the namespace's handle, /run/netns/<Name>.
func (n *NetNS) Path() string { return filepath.Join(netnsRunDir, n.Name) }

// String returns Name.
func (n *NetNS) String() string { return n.Name }

// IP runs `ip -n <Name> args...` and returns its combined output.
func (n *NetNS) IP(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "ip", append([]string{"-n", n.Name}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip -n %s %s: %w: %s", n.Name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// IPBatch feeds lines (one `ip` command each, without the leading "ip") to `ip -n <Name> -batch -`.
func (n *NetNS) IPBatch(ctx context.Context, lines []string) error {
	cmd := exec.CommandContext(ctx, "ip", "-n", n.Name, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -n %s -batch: %w: %s", n.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Run runs args[0] with args[1:] inside the namespace (`ip netns exec`) and returns its combined
// output; the error includes that output.
func (n *NetNS) Run(ctx context.Context, args ...string) (string, error) {
	if len(args) == 0 {
		return "", errors.New("netns run: no command")
	}
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in %s: %s: %w: %s", n.Name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Command returns an unstarted command running name inside the namespace (`ip netns exec`, which
// execs name, so the started process's PID is the daemon's). Use it for long-running processes, with
// Process to supervise them. Delete kills those of these commands still running in the namespace.
func (n *NetNS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	n.mu.Lock()
	n.cmds = append(n.cmds, cmd)
	n.mu.Unlock()
	return cmd
}

// PIDs returns the processes inside the namespace (`ip netns pids`).
func (n *NetNS) PIDs() ([]int, error) {
	out, err := exec.Command("ip", "netns", "pids", n.Name).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ip netns pids %s: %w: %s", n.Name, err, strings.TrimSpace(string(out)))
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// Delete kills (SIGKILL, by PID) the processes started through Command that still run inside the
// namespace, and removes the namespace. It kills nothing else: if other processes remain inside,
// the namespace is still removed from /run/netns (it lives on until they exit) and an error names
// them. Delete is idempotent.
func (n *NetNS) Delete() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.deleted {
		return nil
	}
	var errs []error
	inside := map[int]bool{}
	if pids, err := n.PIDs(); err == nil {
		for _, p := range pids {
			inside[p] = true
		}
	}
	var killed []int
	for _, cmd := range n.cmds {
		if cmd.Process != nil && inside[cmd.Process.Pid] {
			if err := cmd.Process.Kill(); err == nil {
				killed = append(killed, cmd.Process.Pid)
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(killed) > 0 && time.Now().Before(deadline) {
		pids, err := n.PIDs()
		if err != nil || !containsAny(pids, killed) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if pids, err := n.PIDs(); err == nil && len(pids) > 0 {
		errs = append(errs, fmt.Errorf("processes not started by the harness still in %s: %v (not killed)", n.Name, pids))
	}
	if out, err := exec.Command("ip", "netns", "delete", n.Name).CombinedOutput(); err != nil {
		if _, serr := os.Stat(n.Path()); serr == nil {
			errs = append(errs, fmt.Errorf("ip netns delete %s: %w: %s", n.Name, err, strings.TrimSpace(string(out))))
		}
	}
	n.deleted = true
	return errors.Join(errs...)
}

func containsAny(have, want []int) bool {
	for _, h := range have {
		for _, w := range want {
			if h == w {
				return true
			}
		}
	}
	return false
}

// Do runs fn on an OS thread switched into the namespace (setns), then switches the thread back. Sockets
// created inside fn live in the namespace and stay there after Do returns. Goroutines that fn starts do
// NOT run in the namespace. If the thread cannot be switched back it is discarded, never reused.
// A panic in fn is re-raised in the caller.
func (n *NetNS) Do(fn func() error) error {
	target, err := unix.Open(n.Path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", n.Name, err)
	}
	defer unix.Close(target)

	type result struct {
		err      error
		panicked bool
		panicVal any
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("opening current network namespace: %w", err)}
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("entering network namespace %s: %w", n.Name, err)}
			return
		}
		var r result
		func() {
			defer func() {
				if p := recover(); p != nil {
					r.panicked, r.panicVal = true, p
				}
			}()
			r.err = fn()
		}()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it ends with this goroutine instead of serving others.
			r.err = errors.Join(r.err, fmt.Errorf("leaving network namespace %s: %w", n.Name, err))
			ch <- r
			return
		}
		runtime.UnlockOSThread()
		ch <- r
	}()
	r := <-ch
	if r.panicked {
		panic(r.panicVal)
	}
	return r.err
}

// Listen is net.Listen inside the namespace.
func (n *NetNS) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s %s in %s: %w", network, addr, n.Name, err)
	}
	return l, nil
}

// ListenPacket is net.ListenPacket inside the namespace.
func (n *NetNS) ListenPacket(network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := n.Do(func() error {
		var err error
		c, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s %s in %s: %w", network, addr, n.Name, err)
	}
	return c, nil
}

// DialContext dials addr from inside the namespace. A host name in addr is resolved first (outside
// the namespace, by the Go resolver); the connection itself is made from inside.
func (n *NetNS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	addr, err := resolveLiteral(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	var c net.Conn
	err = n.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	if err != nil {
		return nil, err // already names network and address
	}
	return c, nil
}

// resolveLiteral turns host:port into ip:port so that dialing never starts goroutines (which would
// run outside the namespace) for parallel address attempts.
func resolveLiteral(ctx context.Context, network, addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("dial %s %s: %w", network, addr, err)
	}
	if host == "" || net.ParseIP(host) != nil {
		return addr, nil
	}
	want := "ip"
	switch {
	case strings.HasSuffix(network, "4"):
		want = "ip4"
	case strings.HasSuffix(network, "6"):
		want = "ip6"
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, want, host)
	if err != nil || len(ips) == 0 {
		return "", fmt.Errorf("resolving %s: %w", host, errors.Join(err, errors.New("no addresses")))
	}
	return net.JoinHostPort(ips[0].String(), port), nil
}

// HTTPClient returns an HTTP client whose connections are dialed inside the namespace, for the
// /healthz, /livez and /metrics endpoints of a daemon running there. Keep-alives are off, so every
// request uses a fresh connection; the client times out after 10 s.
func (n *NetNS) HTTPClient() *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext:       n.DialContext,
			DisableKeepAlives: true,
			Proxy:             nil,
		},
	}
}

// RemoveStaleNetNS deletes the harness's network namespaces (prefix "kpt-") whose creating process is
// gone, left behind by a test binary that was killed; namespaces of live processes are untouched.
// It returns the names it removed.
func RemoveStaleNetNS() ([]string, error) {
	entries, err := os.ReadDir(netnsRunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", netnsRunDir, err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		pid, ok := creatorPID(name)
		if !ok {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns delete %s: %w: %s", name, err, strings.TrimSpace(string(out))))
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

// OurNetNS lists the existing network namespaces created by this process.
func OurNetNS() ([]string, error) {
	entries, err := os.ReadDir(netnsRunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", netnsRunDir, err)
	}
	var names []string
	for _, e := range entries {
		if pid, ok := creatorPID(e.Name()); ok && pid == os.Getpid() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// creatorPID extracts the creating process's PID from a name made by NewNetNS.
func creatorPID(name string) (int, bool) {
	if !strings.HasPrefix(name, NetNSPrefix) {
		return 0, false
	}
	f := strings.Split(name, "-")
	if len(f) < 4 {
		return 0, false
	}
	pid, err := strconv.Atoi(f[len(f)-2])
	return pid, err == nil && pid > 0
}
