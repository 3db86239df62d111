package engine

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// socketKind is what the kernel says a socket is.
type socketKind struct {
	domain, typ, proto int
	listening          bool
}

// kindOf reads c's domain, type, protocol and whether it listens.
func kindOf(c syscall.Conn) (socketKind, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return socketKind{}, err
	}
	var k socketKind
	var errs [4]error
	if err := rc.Control(func(fd uintptr) {
		k.domain, errs[0] = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN)
		k.typ, errs[1] = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE)
		k.proto, errs[2] = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL)
		var acc int
		acc, errs[3] = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
		k.listening = acc != 0
	}); err != nil {
		return socketKind{}, err
	}
	for _, err := range errs {
		if err != nil {
			return socketKind{}, fmt.Errorf("reading the socket's options: %w", err)
		}
	}
	return k, nil
}

func domainOf(family v1.IPFamily) int {
	if family == v1.IPv6Protocol {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// adoptTCP makes a listener of a stored socket if it is a listening TCP socket of family bound to want.
// f is closed either way.
func adoptTCP(f *os.File, family v1.IPFamily, want netip.AddrPort) (*net.TCPListener, error) {
	// Go's listeners are MPTCP sockets where the kernel has MPTCP (Go 1.24 and later).
	spec := socketKind{domain: domainOf(family), typ: unix.SOCK_STREAM, listening: true}
	return adopt(f, want, string(family)+" TCP", spec, []int{unix.IPPROTO_TCP, unix.IPPROTO_MPTCP}, func(f *os.File) (*net.TCPListener, netip.AddrPort, error) {
		l, err := net.FileListener(f)
		if err != nil {
			return nil, netip.AddrPort{}, err
		}
		ln, ok := l.(*net.TCPListener)
		if !ok {
			_ = l.Close()
			return nil, netip.AddrPort{}, fmt.Errorf("a %s socket", l.Addr().Network())
		}
		return ln, ln.Addr().(*net.TCPAddr).AddrPort(), nil
	})
}

// adoptUDP makes a listener socket of a stored socket if it is a UDP socket of family bound to want. f is
// closed either way.
func adoptUDP(f *os.File, family v1.IPFamily, want netip.AddrPort) (*net.UDPConn, error) {
	spec := socketKind{domain: domainOf(family), typ: unix.SOCK_DGRAM}
	return adopt(f, want, string(family)+" UDP", spec, []int{unix.IPPROTO_UDP}, func(f *os.File) (*net.UDPConn, netip.AddrPort, error) {
		pc, err := net.FilePacketConn(f)
		if err != nil {
			return nil, netip.AddrPort{}, err
		}
		conn, ok := pc.(*net.UDPConn)
		if !ok {
			_ = pc.Close()
			return nil, netip.AddrPort{}, fmt.Errorf("a %s socket", pc.LocalAddr().Network())
		}
		return conn, conn.LocalAddr().(*net.UDPAddr).AddrPort(), nil
	})
}

// adopt wraps a stored socket with wrap and keeps it if the kernel says it is what spec describes (domain,
// type, listening), of one of protos, bound to want: a what socket. f is closed either way.
func adopt[S socket](f *os.File, want netip.AddrPort, what string, spec socketKind, protos []int,
	wrap func(*os.File) (S, netip.AddrPort, error)) (S, error) {
	defer f.Close()
	s, bound, err := wrap(f)
	if err != nil {
		return s, fmt.Errorf("%w: not a %s socket: %v", errNotAdopted, what, err)
	}
	k, err := kindOf(s)
	if err == nil {
		switch {
		case k.domain != spec.domain || k.typ != spec.typ || !slices.Contains(protos, k.proto):
			err = fmt.Errorf("%w: not a %s socket (domain %d, type %d, protocol %d)", errNotAdopted, what, k.domain, k.typ, k.proto)
		case k.listening != spec.listening:
			err = fmt.Errorf("%w: a %s socket that does not listen", errNotAdopted, what)
		default:
			err = checkBound(bound, want)
		}
	}
	if err != nil {
		_ = s.Close()
		var zero S
		return zero, err
	}
	return s, nil
}
