package engine

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// Sockets hands listening sockets over from one process of the daemon to the next: systemd's file
// descriptor store, which systemd.FDStore speaks to. The engine stores each listener's socket under its
// SocketName when it opens it and removes it when the listener is removed (not when the engine is
// closed at shutdown). A process that finds a socket stored under a listener's name takes it up instead
// of opening another, so the listener keeps its port: the capture rules, which point at that port, never
// meet a closed one, and connections that arrive while no process runs wait in the socket's queue.
type Sockets interface {
	// Take returns the socket stored under name by an earlier process, or nil. The caller owns the file;
	// the entry stays in the store.
	Take(name string) *os.File
	// Store keeps c's socket under name, in place of what name held.
	Store(name string, c syscall.Conn) error
	// Remove drops what is stored under name.
	Remove(name string) error
}

// maxSocketName is the longest name systemd takes for a stored descriptor (FDNAME=).
const maxSocketName = 255

// SocketName is the name a listener's socket is stored under: the engine's IP family, the key's protocol,
// policy and name, joined by "/" (for example "IPv4/UDP/cluster/kube-system/kube-dns%3Adns"). A ':' (the
// separator of systemd's list of names), a '%' and anything but printable ASCII are written as %XX. It
// reports false when the name would be longer than the 255 bytes systemd allows: that listener's socket
// is not handed over.
func SocketName(family v1.IPFamily, key Key) (string, bool) {
	var b strings.Builder
	for i, part := range []string{string(family), string(key.Protocol), key.Policy, key.Name} {
		if i > 0 {
			b.WriteByte('/')
		}
		for j := 0; j < len(part); j++ {
			c := part[j]
			if c <= ' ' || c > '~' || c == ':' || c == '%' {
				fmt.Fprintf(&b, "%%%02X", c)
				continue
			}
			b.WriteByte(c)
		}
	}
	name := b.String()
	return name, len(name) <= maxSocketName
}

// errNotAdopted wraps why a stored socket cannot serve a listener.
var errNotAdopted = errors.New("the stored socket does not fit")

// takeSocket returns the file stored for key's listener, or nil.
func (e *Engine) takeSocket(key Key) (*os.File, string) {
	if e.opts.Sockets == nil {
		return nil, ""
	}
	name, ok := SocketName(e.family, key)
	if !ok {
		return nil, ""
	}
	return e.opts.Sockets.Take(name), name
}

// socket is what a listener listens on: a *net.TCPListener or a *net.UDPConn.
type socket interface {
	syscall.Conn
	Close() error
}

// listenTCPSocket returns key's TCP listening socket: the one an earlier process stored when it fits (see
// adoptTCP), else a new one, which it stores.
func (e *Engine) listenTCPSocket(key Key, port uint16) (*net.TCPListener, error) {
	return takeOrListen(e, key, port, adoptTCP, func(a netip.AddrPort) (*net.TCPListener, error) {
		return net.ListenTCP(e.network("tcp"), net.TCPAddrFromAddrPort(a))
	})
}

// listenUDPSocket is listenTCPSocket for UDP.
func (e *Engine) listenUDPSocket(key Key, port uint16) (*net.UDPConn, error) {
	return takeOrListen(e, key, port, adoptUDP, func(a netip.AddrPort) (*net.UDPConn, error) {
		return net.ListenUDP(e.network("udp"), net.UDPAddrFromAddrPort(a))
	})
}

// network is "tcp4" or "tcp6" (proto "tcp"), "udp4" or "udp6" (proto "udp"), as the engine's family.
func (e *Engine) network(proto string) string {
	if e.family == v1.IPv6Protocol {
		return proto + "6"
	}
	return proto + "4"
}

// takeOrListen returns the socket an earlier process stored for key when adopt finds that it fits (the
// engine's family, bound to its address, on port unless port is 0), else a new one from listen, which it
// stores for the next process.
func takeOrListen[S socket](e *Engine, key Key, port uint16,
	adopt func(*os.File, v1.IPFamily, netip.AddrPort) (S, error), listen func(netip.AddrPort) (S, error)) (S, error) {
	want := netip.AddrPortFrom(e.bind, port)
	if f, name := e.takeSocket(key); f != nil {
		s, err := adopt(f, e.family, want)
		if err == nil {
			klog.V(2).InfoS("Took up the userspace proxy listener a previous process stored", "service", key.Name,
				"protocol", key.Protocol, "policy", key.Policy)
			return s, nil
		}
		e.dropStored(key, name, err)
	}
	s, err := listen(want)
	if err != nil {
		return s, err
	}
	e.storeSocket(key, s)
	return s, nil
}

// dropStored removes a stored socket that cannot serve key's listener from the store.
func (e *Engine) dropStored(key Key, name string, why error) {
	klog.InfoS("Not taking up a stored userspace proxy listener; opening a new one", "service", key.Name,
		"protocol", key.Protocol, "policy", key.Policy, "reason", why.Error())
	if err := e.opts.Sockets.Remove(name); err != nil {
		klog.ErrorS(err, "Could not remove a stored userspace proxy listener", "name", name)
	}
}

// storeSocket keeps a new listener's socket for the next process.
func (e *Engine) storeSocket(key Key, c syscall.Conn) {
	if e.opts.Sockets == nil {
		return
	}
	name, ok := SocketName(e.family, key)
	if !ok {
		klog.InfoS("Userspace proxy listener's name is too long to be stored; it will not survive a restart", "service", key.Name, "protocol", key.Protocol)
		return
	}
	if err := e.opts.Sockets.Store(name, c); err != nil {
		klog.V(2).InfoS("Userspace proxy listener not stored; it will not survive a restart", "service", key.Name,
			"protocol", key.Protocol, "policy", key.Policy, "err", err)
	}
}

// forgetSocket removes a removed listener's socket from the store.
func (e *Engine) forgetSocket(key Key) {
	if e.opts.Sockets == nil {
		return
	}
	if name, ok := SocketName(e.family, key); ok {
		if err := e.opts.Sockets.Remove(name); err != nil {
			klog.ErrorS(err, "Could not remove a userspace proxy listener from the store", "name", name)
		}
	}
}

// checkBound reports why a socket bound to got cannot serve a listener that wants to be bound to want (any
// port when want's port is 0).
func checkBound(got, want netip.AddrPort) error {
	if got.Addr().Unmap() != want.Addr().Unmap() || (want.Port() != 0 && got.Port() != want.Port()) {
		return fmt.Errorf("%w: bound to %s, want %s", errNotAdopted, got, want)
	}
	return nil
}
