//go:build !linux

package engine

import (
	"io"
	"net"
)

// copyStream is io.Copy where splice(2) is not available.
func copyStream(dst, src *net.TCPConn) (int64, error) { return io.Copy(dst, src) }
