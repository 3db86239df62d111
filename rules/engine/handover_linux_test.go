package engine

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

func TestSocketName(t *testing.T) {
	for _, tc := range []struct {
		family v1.IPFamily
		key    Key
		want   string
		ok     bool
	}{
		{v1.IPv4Protocol, Key{Name: "kube-system/kube-dns:dns", Protocol: v1.ProtocolUDP, Policy: "cluster"},
			"IPv4/UDP/cluster/kube-system/kube-dns%3Adns", true},
		{v1.IPv6Protocol, Key{Name: "default/web", Protocol: v1.ProtocolTCP, Policy: "local"},
			"IPv6/TCP/local/default/web", true},
		// Whatever a front names its listeners by: systemd's separator, the escape itself, spaces and
		// bytes outside printable ASCII are escaped, so two keys never share a name.
		{v1.IPv4Protocol, Key{Name: "a:b%c d\n\xff", Protocol: v1.ProtocolTCP}, "IPv4/TCP//a%3Ab%25c%20d%0A%FF", true},
		{v1.IPv4Protocol, Key{Name: "a%3Ab", Protocol: v1.ProtocolTCP}, "IPv4/TCP//a%253Ab", true},
		// The longest names Kubernetes allows fit.
		{v1.IPv4Protocol, Key{Name: strings.Repeat("n", 63) + "/" + strings.Repeat("s", 63) + ":" + strings.Repeat("p", 15), Protocol: v1.ProtocolUDP, Policy: "cluster"},
			"IPv4/UDP/cluster/" + strings.Repeat("n", 63) + "/" + strings.Repeat("s", 63) + "%3A" + strings.Repeat("p", 15), true},
		{v1.IPv4Protocol, Key{Name: strings.Repeat("x", 250), Protocol: v1.ProtocolTCP}, "IPv4/TCP//" + strings.Repeat("x", 250), false},
	} {
		got, ok := SocketName(tc.family, tc.key)
		if got != tc.want || ok != tc.ok {
			t.Errorf("SocketName(%s, %v) = %q, %v; want %q, %v", tc.family, tc.key, got, ok, tc.want, tc.ok)
		}
		if ok && (strings.ContainsAny(got, ": \n") || len(got) > 255) {
			t.Errorf("SocketName(%s, %v) = %q is not a name systemd takes", tc.family, tc.key, got)
		}
	}
}

// fakeStore simulates the service manager's descriptor store: it keeps its own duplicate of every socket
// stored, by name, which keeps the socket open after the process that stored it closed its own, and
// passes duplicates of them to the next process (restart).
type fakeStore struct {
	mu        sync.Mutex
	held      map[string][]int      // the manager's duplicates
	inherited map[string][]*os.File // what this process was passed at start
}

func newFakeStore(t *testing.T) *fakeStore {
	s := &fakeStore{held: map[string][]int{}, inherited: map[string][]*os.File{}}
	t.Cleanup(s.stop)
	return s
}

func (s *fakeStore) Take(name string) *os.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	files := s.inherited[name]
	delete(s.inherited, name)
	if len(files) == 0 {
		return nil
	}
	return files[0]
}

func (s *fakeStore) Store(name string, c syscall.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var dup int
	var dupErr error
	if err := rc.Control(func(fd uintptr) { dup, dupErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return err
	}
	if dupErr != nil {
		return dupErr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeHeld(name)
	s.held[name] = []int{dup}
	return nil
}

func (s *fakeStore) Remove(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeHeld(name)
	for _, f := range s.inherited[name] {
		_ = f.Close()
	}
	delete(s.inherited, name)
	return nil
}

func (s *fakeStore) closeHeld(name string) {
	for _, fd := range s.held[name] {
		_ = unix.Close(fd)
	}
	delete(s.held, name)
}

// put stores a socket under name as an earlier process would have.
func (s *fakeStore) put(t *testing.T, name string, c syscall.Conn) {
	t.Helper()
	if err := s.Store(name, c); err != nil {
		t.Fatal(err)
	}
}

// restart passes duplicates of what the store holds to the next process.
func (s *fakeStore) restart(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, files := range s.inherited {
		for _, f := range files {
			_ = f.Close()
		}
	}
	s.inherited = map[string][]*os.File{}
	for name, fds := range s.held {
		for _, fd := range fds {
			dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			s.inherited[name] = append(s.inherited[name], os.NewFile(uintptr(dup), name))
		}
	}
}

func (s *fakeStore) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name := range s.held {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// stop is the unit stopping: the store is emptied.
func (s *fakeStore) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.held {
		s.closeHeld(name)
	}
	for _, files := range s.inherited {
		for _, f := range files {
			_ = f.Close()
		}
	}
	s.inherited = map[string][]*os.File{}
}

func engineWithStore(t *testing.T, s Sockets) *Engine {
	t.Helper()
	e := New(v1.IPv4Protocol, loopback, Options{Sockets: s}, NewMetrics(prometheus.NewRegistry()))
	t.Cleanup(e.Close)
	return e
}

var udpSvcKey = Key{Name: "ns/dns:dns", Protocol: v1.ProtocolUDP, Policy: "cluster"}

// TestListenersSurviveARestart: a process stores its listeners; after it has gone (its engine closed),
// the sockets still take connections and datagrams, which wait until the next process takes the sockets
// up, on the same ports, and serves them. Without a store the same connection is refused.
func TestListenersSurviveARestart(t *testing.T) {
	a := newBackend(t, "a")
	u := udpBackend(t, "u")
	store := newFakeStore(t)
	first := engineWithStore(t, store)
	tcpPort, err := first.Ensure(tcpKey, Target{Endpoints: []netip.AddrPort{a.addr()}})
	if err != nil {
		t.Fatal(err)
	}
	udpPort, err := first.Ensure(udpSvcKey, Target{Endpoints: []netip.AddrPort{u}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"IPv4/TCP/cluster/ns/svc%3Ahttp", "IPv4/UDP/cluster/ns/dns%3Adns"}
	if got := store.names(); !slices.Equal(got, want) {
		t.Fatalf("stored %q, want %q", got, want)
	}
	first.Close()
	if got := store.names(); !slices.Equal(got, want) {
		t.Fatalf("closing the engine (the daemon stopping) left %q in the store, want %q", got, want)
	}

	// No process: the kernel still completes the handshake and queues what arrives.
	tcpAddr, udpAddr := netip.AddrPortFrom(loopback, tcpPort), netip.AddrPortFrom(loopback, udpPort)
	waiting, err := net.DialTimeout("tcp", tcpAddr.String(), time.Second)
	if err != nil {
		t.Fatalf("connecting while no process runs: %v", err)
	}
	defer waiting.Close()
	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.WriteToUDPAddrPort([]byte("early"), udpAddr); err != nil {
		t.Fatal(err)
	}

	store.restart(t)
	second := engineWithStore(t, store)
	if p, err := second.Ensure(tcpKey, Target{Endpoints: []netip.AddrPort{a.addr()}}); err != nil || p != tcpPort {
		t.Fatalf("TCP listener after the restart on port %d (%v), want %d", p, err, tcpPort)
	}
	if p, err := second.Ensure(udpSvcKey, Target{Endpoints: []netip.AddrPort{u}}); err != nil || p != udpPort {
		t.Fatalf("UDP listener after the restart on port %d (%v), want %d", p, err, udpPort)
	}
	if name, err := askOn(waiting); err != nil || name != "a" {
		t.Fatalf("the connection made while no process ran: %q, %v", name, err)
	}
	buf := make([]byte, 512)
	_ = client.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, from, err := client.ReadFromUDPAddrPort(buf)
	if err != nil || !strings.HasSuffix(string(buf[:n]), " early") || from != udpAddr {
		t.Fatalf("the datagram sent while no process ran: %q from %s, %v", buf[:n], from, err)
	}
	if name, err := ask(t, tcpAddr); err != nil || name != "a" {
		t.Fatalf("a new connection after the restart: %q, %v", name, err)
	}

	// The old behaviour, without a store: nothing listens once the process has gone.
	plain := engineWithStore(t, nil)
	p, err := plain.Ensure(tcpKey, Target{Endpoints: []netip.AddrPort{a.addr()}})
	if err != nil {
		t.Fatal(err)
	}
	plain.Close()
	if _, err := net.DialTimeout("tcp", netip.AddrPortFrom(loopback, p).String(), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("without a store, a connection after the close: %v, want refused", err)
	}
}

// TestRemovedListenerLeavesTheStore: a listener removed (its Service port gone) is dropped from the store,
// and its socket closes for good; one that moves to another port is stored anew.
func TestRemovedListenerLeavesTheStore(t *testing.T) {
	a := newBackend(t, "a")
	store := newFakeStore(t)
	e := engineWithStore(t, store)
	p := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{a.addr()}})
	e.Remove(tcpKey)
	if got := store.names(); len(got) != 0 {
		t.Fatalf("store after Remove: %q, want empty", got)
	}
	if _, err := net.DialTimeout("tcp", p.String(), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a removed listener's port: %v, want refused", err)
	}

	first := closedPort(t).Port()
	if _, err := e.EnsureAt(tcpKey, first, Target{Endpoints: []netip.AddrPort{a.addr()}}); err != nil {
		t.Fatal(err)
	}
	other := closedPort(t).Port()
	if _, err := e.EnsureAt(tcpKey, other, Target{Endpoints: []netip.AddrPort{a.addr()}}); err != nil {
		t.Fatal(err)
	}
	e.Close()
	store.restart(t)
	next := engineWithStore(t, store)
	if got, err := next.EnsureAt(tcpKey, other, Target{Endpoints: []netip.AddrPort{a.addr()}}); err != nil || got != other {
		t.Fatalf("after the restart, EnsureAt(%d) = %d, %v", other, got, err)
	}
	if _, err := net.DialTimeout("tcp", netip.AddrPortFrom(loopback, first).String(), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("the port the listener left: %v, want refused", err)
	}
}

// TestStoredSocketThatDoesNotFit: a socket stored under a listener's name that cannot serve it (another
// protocol, another family, not listening, another address or port) is dropped from the store and
// closed; the listener gets a new socket, which is stored in its place.
func TestStoredSocketThatDoesNotFit(t *testing.T) {
	a := newBackend(t, "a")
	name, _ := SocketName(v1.IPv4Protocol, tcpKey)
	wrongPort := closedPort(t).Port()
	for _, tc := range []struct {
		what string
		make func(t *testing.T) syscall.Conn
		port uint16 // EnsureAt's
	}{
		{"a UDP socket", func(t *testing.T) syscall.Conn {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}, 0},
		{"an IPv6 socket", func(t *testing.T) syscall.Conn {
			ln, err := net.ListenTCP("tcp6", &net.TCPAddr{IP: net.IPv6loopback})
			if err != nil {
				t.Skipf("no IPv6: %v", err)
			}
			return ln
		}, 0},
		{"a socket that does not listen", func(t *testing.T) syscall.Conn {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
				t.Fatal(err)
			}
			return os.NewFile(uintptr(fd), "bound")
		}, 0},
		{"a socket on another address", func(t *testing.T) syscall.Conn {
			ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)})
			if err != nil {
				t.Fatal(err)
			}
			return ln
		}, 0},
		{"a socket on another port", func(t *testing.T) syscall.Conn {
			ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			return ln
		}, wrongPort},
	} {
		t.Run(tc.what, func(t *testing.T) {
			store := newFakeStore(t)
			c := tc.make(t)
			store.put(t, name, c)
			stale := storedInode(t, store, name)
			closeConn(c)
			store.restart(t)
			e := engineWithStore(t, store)
			p, err := e.EnsureAt(tcpKey, tc.port, Target{Endpoints: []netip.AddrPort{a.addr()}})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := ask(t, netip.AddrPortFrom(loopback, p)); err != nil || got != "a" {
				t.Fatalf("the new listener: %q, %v", got, err)
			}
			if got := store.names(); !slices.Equal(got, []string{name}) {
				t.Fatalf("store %q, want the new listener's %q", got, name)
			}
			if storedInode(t, store, name) == stale {
				t.Error("the socket that does not fit is still stored")
			}
		})
	}
}

func storedInode(t *testing.T, s *fakeStore, name string) uint64 {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	fds := s.held[name]
	if len(fds) != 1 {
		t.Fatalf("store holds %d descriptors under %s", len(fds), name)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fds[0], &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func closeConn(c syscall.Conn) {
	if cl, ok := c.(interface{ Close() error }); ok {
		_ = cl.Close()
	} else {
		panic(fmt.Sprintf("%T has no Close", c))
	}
}
