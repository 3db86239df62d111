//go:build !linux

package engine

import "errors"

// udpPoller needs Linux's epoll.
type udpPoller struct{}

func (*udpPoller) close() {}

// listenUDP needs Linux's IP_PKTINFO and epoll.
func (e *Engine) listenUDP(Key, Target, uint16) (listener, error) {
	return nil, errors.New("the userspace UDP proxy needs Linux")
}
