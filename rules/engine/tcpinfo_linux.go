package engine

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// idleFor returns how long ago c last received data, from the kernel's TCP_INFO.
func idleFor(c *net.TCPConn) (time.Duration, bool) {
	ago, _, ok := heard(c)
	return ago, ok
}

// heard returns how long ago c last received data and how many bytes it has received, from the kernel's
// TCP_INFO.
func heard(c *net.TCPConn) (ago time.Duration, bytes uint64, ok bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var (
		info *unix.TCPInfo
		gerr error
	)
	if err := rc.Control(func(fd uintptr) { info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || gerr != nil {
		return 0, 0, false
	}
	return time.Duration(info.Last_data_recv) * time.Millisecond, info.Bytes_received, true
}
