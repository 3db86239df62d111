//go:build !linux

package engine

import (
	"net"
	"time"
)

// idleFor is not available here: connections have no idle timeout.
func idleFor(*net.TCPConn) (time.Duration, bool) { return 0, false }

// heard is not available here: every connection counts as under way when draining.
func heard(*net.TCPConn) (time.Duration, uint64, bool) { return 0, 0, false }
