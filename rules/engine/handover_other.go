//go:build !linux

package engine

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	v1 "k8s.io/api/core/v1"
)

// adoptTCP needs Linux's socket options to check what a stored socket is.
func adoptTCP(f *os.File, _ v1.IPFamily, _ netip.AddrPort) (*net.TCPListener, error) {
	_ = f.Close()
	return nil, fmt.Errorf("%w: stored sockets are taken up on Linux only", errNotAdopted)
}

// adoptUDP needs Linux's socket options to check what a stored socket is.
func adoptUDP(f *os.File, _ v1.IPFamily, _ netip.AddrPort) (*net.UDPConn, error) {
	_ = f.Close()
	return nil, fmt.Errorf("%w: stored sockets are taken up on Linux only", errNotAdopted)
}
