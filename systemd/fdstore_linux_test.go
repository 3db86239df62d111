package systemd

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeManager simulates the service manager's side of the file descriptor store on a real notify socket:
// it reads the notifications (with their SCM_RIGHTS descriptors), keeps what FDSTORE=1 stores under its
// FDNAME= (a descriptor of a socket it already holds is not stored twice; past limit, descriptors are
// closed, as systemd does), drops a name's entries on FDSTOREREMOVE=1, and passes duplicates of what it
// holds to the next process.
type fakeManager struct {
	t     *testing.T
	path  string
	conn  *net.UnixConn
	limit int
	held  []heldFD
}

type heldFD struct {
	name   string
	fd     int
	noPoll bool
}

func newFakeManager(t *testing.T, limit int) *fakeManager {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	m := &fakeManager{t: t, path: path, conn: conn, limit: limit}
	t.Cleanup(func() {
		_ = conn.Close()
		for _, h := range m.held {
			_ = unix.Close(h.fd)
		}
	})
	return m
}

// send is what a store uses to reach this manager.
func (m *fakeManager) send(state string, fd int) error { return notifyWithFD(m.path, state, fd) }

// receive handles every notification sent so far.
func (m *fakeManager) receive() {
	m.t.Helper()
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*16))
	for {
		_ = m.conn.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, oobn, _, _, err := m.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		var fds []int
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			m.t.Fatal(err)
		}
		for _, msg := range msgs {
			got, err := unix.ParseUnixRights(&msg)
			if err != nil {
				m.t.Fatal(err)
			}
			fds = append(fds, got...)
		}
		m.handle(strings.Split(string(buf[:n]), "\n"), fds)
	}
}

func (m *fakeManager) handle(lines []string, fds []int) {
	fields := map[string]string{}
	for _, l := range lines {
		if k, v, ok := strings.Cut(l, "="); ok {
			fields[k] = v
		}
	}
	switch {
	case fields["FDSTORE"] == "1":
		for _, fd := range fds {
			dup := slices.ContainsFunc(m.held, func(h heldFD) bool { return sameFile(h.fd, fd) })
			if dup || len(m.held) >= m.limit {
				_ = unix.Close(fd)
				continue
			}
			m.held = append(m.held, heldFD{name: fields["FDNAME"], fd: fd, noPoll: fields["FDPOLL"] == "0"})
		}
	case fields["FDSTOREREMOVE"] == "1":
		m.held = slices.DeleteFunc(m.held, func(h heldFD) bool {
			if h.name != fields["FDNAME"] {
				return false
			}
			_ = unix.Close(h.fd)
			return true
		})
		fallthrough
	default:
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
}

// restart returns the store of the next process: duplicates of what the manager holds, by name.
func (m *fakeManager) restart(max int) *FDStore {
	m.t.Helper()
	m.receive()
	inherited := map[string][]*os.File{}
	for _, h := range m.held {
		dup, err := unix.FcntlInt(uintptr(h.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			m.t.Fatal(err)
		}
		inherited[h.name] = append(inherited[h.name], os.NewFile(uintptr(dup), h.name))
	}
	return newFDStore(inherited, m.send, max)
}

// names returns the names held, sorted, one per entry.
func (m *fakeManager) names() []string {
	m.receive()
	var out []string
	for _, h := range m.held {
		out = append(out, h.name)
	}
	slices.Sort(out)
	return out
}

func sameFile(a, b int) bool {
	var sa, sb unix.Stat_t
	return unix.Fstat(a, &sa) == nil && unix.Fstat(b, &sb) == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

func listener(t *testing.T) *net.TCPListener {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// port returns the port of the TCP socket f holds.
func port(t *testing.T, f *os.File) int {
	t.Helper()
	sa, err := unix.Getsockname(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*unix.SockaddrInet4).Port
}

// TestFDStoreAcrossRestarts: what one process stores, the next one finds by name, the same sockets; a
// removed name is gone; what the next process does not take is released from the store and closed.
func TestFDStoreAcrossRestarts(t *testing.T) {
	m := newFakeManager(t, 10)
	first := newFDStore(nil, m.send, 0)
	a, b, c := listener(t), listener(t), listener(t)
	for name, ln := range map[string]*net.TCPListener{"IPv4/TCP/cluster/ns/a%3Ahttp": a, "IPv4/TCP/cluster/ns/b": b, "IPv4/UDP/local/ns/c": c} {
		if err := first.Store(name, ln); err != nil {
			t.Fatal(err)
		}
	}
	if err := first.Remove("IPv4/UDP/local/ns/c"); err != nil {
		t.Fatal(err)
	}
	if got, want := m.names(), []string{"IPv4/TCP/cluster/ns/a%3Ahttp", "IPv4/TCP/cluster/ns/b"}; !slices.Equal(got, want) {
		t.Fatalf("manager holds %q, want %q", got, want)
	}
	for _, h := range m.held {
		if !h.noPoll {
			t.Errorf("%s stored without FDPOLL=0", h.name)
		}
	}

	next := m.restart(0)
	if n := next.Inherited(); n != 2 {
		t.Fatalf("next process inherited %d descriptors, want 2", n)
	}
	got := next.Take("IPv4/TCP/cluster/ns/a%3Ahttp")
	if got == nil {
		t.Fatal("next process found nothing under a's name")
	}
	defer got.Close()
	if p := port(t, got); p != a.Addr().(*net.TCPAddr).Port {
		t.Errorf("a's name holds a socket on port %d, want a's %d", p, a.Addr().(*net.TCPAddr).Port)
	}
	if again := next.Take("IPv4/TCP/cluster/ns/a%3Ahttp"); again != nil {
		t.Error("a name taken twice")
	}
	if none := next.Take("IPv4/UDP/local/ns/c"); none != nil {
		t.Error("a removed name was passed on")
	}
	if released := next.ReleaseUnclaimed(); !slices.Equal(released, []string{"IPv4/TCP/cluster/ns/b"}) {
		t.Errorf("released %q, want b's name", released)
	}
	if got, want := m.names(), []string{"IPv4/TCP/cluster/ns/a%3Ahttp"}; !slices.Equal(got, want) {
		t.Fatalf("after the release the manager holds %q, want %q", got, want)
	}
	// b's socket is closed everywhere but in the first process: nothing else listens on it.
	_ = b.Close()
	if _, err := net.DialTimeout("tcp", b.Addr().String(), time.Second); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("b's port after its release: %v, want refused", err)
	}
}

// TestFDStoreReplacesAName: storing a name again replaces its entry instead of adding a second one.
func TestFDStoreReplacesAName(t *testing.T) {
	m := newFakeManager(t, 10)
	s := newFDStore(nil, m.send, 0)
	old, cur := listener(t), listener(t)
	for _, ln := range []*net.TCPListener{old, cur} {
		if err := s.Store("IPv4/TCP/cluster/ns/a", ln); err != nil {
			t.Fatal(err)
		}
	}
	next := m.restart(0)
	if n := next.Inherited(); n != 1 {
		t.Fatalf("%d entries under the name, want 1", n)
	}
	f := next.Take("IPv4/TCP/cluster/ns/a")
	defer f.Close()
	if p := port(t, f); p != cur.Addr().(*net.TCPAddr).Port {
		t.Errorf("the name holds port %d, want the second socket's %d", p, cur.Addr().(*net.TCPAddr).Port)
	}
}

// TestFDStoreFull: with the store's size known ($FDSTORE, systemd 254 and later), a store that is full
// refuses without sending; with it unknown (systemd 252) the manager closes what is over its limit, and
// the next process does not find it.
func TestFDStoreFull(t *testing.T) {
	m := newFakeManager(t, 1)
	known := newFDStore(nil, m.send, 1)
	if err := known.Store("IPv4/TCP/cluster/ns/a", listener(t)); err != nil {
		t.Fatal(err)
	}
	if err := known.Store("IPv4/TCP/cluster/ns/b", listener(t)); !errors.Is(err, ErrFDStoreFull) {
		t.Fatalf("storing past $FDSTORE: %v, want ErrFDStoreFull", err)
	}
	if err := known.Remove("IPv4/TCP/cluster/ns/a"); err != nil {
		t.Fatal(err)
	}
	if err := known.Store("IPv4/TCP/cluster/ns/b", listener(t)); err != nil {
		t.Fatalf("storing after a removal made room: %v", err)
	}

	unknown := newFDStore(nil, m.send, 0)
	if err := unknown.Store("IPv4/TCP/cluster/ns/c", listener(t)); err != nil {
		t.Fatalf("storing with the size unknown: %v", err)
	}
	if got := m.names(); !slices.Equal(got, []string{"IPv4/TCP/cluster/ns/b"}) {
		t.Errorf("manager holds %q, want only b (c was over its limit)", got)
	}
}

// TestFDStoreWithoutServiceManager: outside systemd nothing is stored or found.
func TestFDStoreWithoutServiceManager(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("LISTEN_PID", "")
	s := OpenFDStore()
	if err := s.Store("IPv4/TCP/cluster/ns/a", listener(t)); err != nil {
		t.Errorf("Store without a service manager: %v", err)
	}
	if f := s.Take("IPv4/TCP/cluster/ns/a"); f != nil {
		t.Error("Take without a service manager found a descriptor")
	}
	if err := s.Remove("IPv4/TCP/cluster/ns/a"); err != nil {
		t.Errorf("Remove without a service manager: %v", err)
	}
	if got := s.ReleaseUnclaimed(); len(got) != 0 {
		t.Errorf("released %q", got)
	}
}

// TestOpenFDStoreFromEnvironment: the store systemd's environment describes sends to NOTIFY_SOCKET and
// knows its size from $FDSTORE.
func TestOpenFDStoreFromEnvironment(t *testing.T) {
	m := newFakeManager(t, 10)
	t.Setenv("NOTIFY_SOCKET", m.path)
	t.Setenv("FDSTORE", "3")
	s := OpenFDStore()
	if s.max != 3 {
		t.Errorf("size %d, want $FDSTORE's 3", s.max)
	}
	if err := s.Store("IPv4/TCP/cluster/ns/a", listener(t)); err != nil {
		t.Fatal(err)
	}
	if got := m.names(); !slices.Equal(got, []string{"IPv4/TCP/cluster/ns/a"}) {
		t.Errorf("manager holds %q", got)
	}
}

func TestFDStoreNames(t *testing.T) {
	s := newFDStore(nil, func(string, int) error { return nil }, 0)
	for _, name := range []string{"", "a:b", "a b", "a\nFDSTOREREMOVE=1", "\x7f", strings.Repeat("x", 256)} {
		if err := s.Store(name, listener(t)); err == nil {
			t.Errorf("Store(%q) accepted a name systemd refuses", name)
		}
	}
	if err := s.Store(strings.Repeat("x", 255), listener(t)); err != nil {
		t.Errorf("a 255-byte name: %v", err)
	}
}
