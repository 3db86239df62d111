package systemd

import (
	"fmt"
	"os"
	"strconv"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// OpenFDStore returns this unit's file descriptor store: it takes the descriptors systemd passed at start
// (LISTEN_FDS and LISTEN_FDNAMES, for this process only: LISTEN_PID), marks them close-on-exec and unsets
// those variables, so call it before the daemon runs any command. Outside systemd the store is empty and
// storing does nothing.
func OpenFDStore() *FDStore {
	inherited := activation.FilesWithNames()
	max, _ := strconv.Atoi(os.Getenv("FDSTORE"))
	path := os.Getenv("NOTIFY_SOCKET")
	var send func(string, int) error
	if path != "" {
		send = func(state string, fd int) error { return notifyWithFD(path, state, fd) }
	}
	s := newFDStore(inherited, send, max)
	if n := s.Inherited(); n > 0 {
		klog.InfoS("Descriptors from the service manager's store", "count", n, "storeMax", max)
	}
	return s
}

// notifyWithFD sends state to the service manager's notify socket at path, with fd attached (SCM_RIGHTS)
// unless it is negative. go-systemd's daemon package (v22.7.0) sends no descriptors, so the datagram is
// written here.
func notifyWithFD(path, state string, fd int) error {
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening a socket to the service manager: %w", err)
	}
	defer unix.Close(sock)
	var rights []byte
	if fd >= 0 {
		rights = unix.UnixRights(fd)
	}
	// A leading '@' names an abstract socket, which unix.SockaddrUnix handles.
	if err := unix.Sendmsg(sock, []byte(state), rights, &unix.SockaddrUnix{Name: path}, 0); err != nil {
		return fmt.Errorf("notifying the service manager: %w", err)
	}
	return nil
}
