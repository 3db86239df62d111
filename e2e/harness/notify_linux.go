package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// NotifyMessage is one datagram received on a NotifySocket.
type NotifyMessage struct {
	// Text is the datagram: newline-separated assignments such as "READY=1\nSTATUS=...".
	Text string
	// PID is the sender's process ID as the kernel reported it (SCM_CREDENTIALS), 0 if unknown.
	PID int
	// Time is when the harness read the datagram.
	Time time.Time
}

// NotifySocket is a real unix datagram socket that receives sd_notify(3) messages the way systemd
// does, so a test can pass NOTIFY_SOCKET to a daemon and assert READY=1, RELOADING=1, STOPPING=1,
// WATCHDOG=1 and STATUS=... . A process in another network namespace reaches it by path as well.
type NotifySocket struct {
	// Path is the socket's file name, the value for NOTIFY_SOCKET.
	Path string

	conn    *net.UnixConn
	tmpDir  string // removed on Close when the socket had to move to a short path
	mu      sync.Mutex
	msgs    []NotifyMessage
	lines   []string
	changed chan struct{} // closed and replaced whenever a message arrives or the socket closes
	closed  bool
	done    chan struct{}
}

// maxSocketPath is the longest path a sockaddr_un holds, without its terminating NUL.
const maxSocketPath = 107

// NewNotifySocket creates dir/notify.sock (or, when that path is too long for a unix socket, a socket
// in a short directory under the system temp dir) and starts receiving on it. Close it when done.
func NewNotifySocket(dir string) (*NotifySocket, error) {
	s := &NotifySocket{Path: filepath.Join(dir, "notify.sock"), changed: make(chan struct{}), done: make(chan struct{})}
	if len(s.Path) > maxSocketPath {
		tmp, err := os.MkdirTemp("", "kpt-notify-")
		if err != nil {
			return nil, fmt.Errorf("creating short directory for notify socket: %w", err)
		}
		s.tmpDir, s.Path = tmp, filepath.Join(tmp, "notify.sock")
	}
	_ = os.Remove(s.Path)
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: s.Path, Net: "unixgram"})
	if err != nil {
		s.removeTmp()
		return nil, fmt.Errorf("listening on notify socket %s: %w", s.Path, err)
	}
	s.conn = conn
	if err := setPassCred(conn); err != nil {
		_ = conn.Close()
		s.removeTmp()
		return nil, err
	}
	go s.receive()
	return s, nil
}

func setPassCred(conn *net.UnixConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("notify socket: %w", err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil {
		return fmt.Errorf("notify socket: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("enabling SO_PASSCRED on notify socket: %w", serr)
	}
	return nil
}

func (s *NotifySocket) receive() {
	defer close(s.done)
	buf := make([]byte, 64*1024)
	oob := make([]byte, 4096)
	for {
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			s.mu.Lock()
			s.closed = true
			close(s.changed)
			s.changed = make(chan struct{})
			s.mu.Unlock()
			return
		}
		m := NotifyMessage{Text: string(buf[:n]), Time: time.Now()}
		if cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, c := range cmsgs {
				if cred, err := unix.ParseUnixCredentials(&c); err == nil {
					m.PID = int(cred.Pid)
				}
				if fds, err := unix.ParseUnixRights(&c); err == nil {
					for _, fd := range fds { // FDSTORE=1 and the like: not kept
						_ = unix.Close(fd)
					}
				}
			}
		}
		s.mu.Lock()
		s.msgs = append(s.msgs, m)
		for _, l := range strings.Split(m.Text, "\n") {
			if l != "" {
				s.lines = append(s.lines, l)
			}
		}
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}
}

// Env returns "NOTIFY_SOCKET=<Path>", for a command's environment.
func (s *NotifySocket) Env() string { return "NOTIFY_SOCKET=" + s.Path }

// Messages returns the text of every datagram received so far, in order.
func (s *NotifySocket) Messages() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.msgs))
	for i, m := range s.msgs {
		out[i] = m.Text
	}
	return out
}

// Received returns every datagram received so far with its sender's PID.
func (s *NotifySocket) Received() []NotifyMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]NotifyMessage(nil), s.msgs...)
}

// Lines returns every non-empty line (assignment) received so far, in order, across datagrams.
func (s *NotifySocket) Lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// WaitFor waits until some line received since the socket was created equals want (e.g. "READY=1").
func (s *NotifySocket) WaitFor(ctx context.Context, want string) error {
	_, err := s.WaitForLine(ctx, 0, func(l string) bool { return l == want })
	if err != nil {
		return fmt.Errorf("waiting for %q on %s (got %q): %w", want, s.Path, s.Lines(), err)
	}
	return nil
}

// WaitForLine waits until a line with index >= from (see Lines) satisfies match, and returns its
// index. Pass len(Lines()) taken before an action to wait for a message caused by that action.
func (s *NotifySocket) WaitForLine(ctx context.Context, from int, match func(line string) bool) (int, error) {
	for {
		s.mu.Lock()
		for i := from; i < len(s.lines); i++ {
			if match(s.lines[i]) {
				s.mu.Unlock()
				return i, nil
			}
		}
		if len(s.lines) > from {
			from = len(s.lines)
		}
		changed, closed := s.changed, s.closed
		s.mu.Unlock()
		if closed {
			return -1, errors.New("notify socket closed")
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return -1, ctx.Err()
		}
	}
}

// Close stops receiving and removes the socket file. Received messages stay readable.
func (s *NotifySocket) Close() error {
	err := s.conn.Close()
	<-s.done
	_ = os.Remove(s.Path)
	s.removeTmp()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("closing notify socket: %w", err)
	}
	return nil
}

func (s *NotifySocket) removeTmp() {
	if s.tmpDir != "" {
		_ = os.RemoveAll(s.tmpDir)
	}
}
