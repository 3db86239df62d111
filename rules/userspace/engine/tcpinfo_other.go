//go:build !linux

package engine

import (
	"net"
	"time"
)

// idleFor is not available here: connections have no idle timeout.
func idleFor(*net.TCPConn) (time.Duration, bool) { return 0, false }
