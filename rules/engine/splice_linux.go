package engine

import (
	"errors"
	"net"

	"golang.org/x/sys/unix"
)

// copyStream copies src to dst until src's EOF with splice(2), like io.Copy between two TCPConns, but
// holds a pipe only while bytes are in flight. io.Copy takes a pipe (two descriptors) per direction for
// the whole life of a connection, waiting for data with it: three times the descriptors of the two
// sockets on an idle connection, measured. Here the wait for data holds nothing but the goroutine; the
// pipe comes from a small pool once data is there and goes back once it has been passed on.
func copyStream(dst, src *net.TCPConn) (int64, error) {
	srcRC, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	dstRC, err := dst.SyscallConn()
	if err != nil {
		return 0, err
	}
	var total int64
	var peek [1]byte
	for {
		// Wait until src is readable (data or EOF) without taking anything.
		var eof bool
		var werr error
		if err := srcRC.Read(func(fd uintptr) bool {
			n, _, err := unix.Recvfrom(int(fd), peek[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			switch {
			case err == unix.EAGAIN || err == unix.EINTR:
				return false
			case err != nil:
				werr = err
			case n == 0:
				eof = true
			}
			return true
		}); err != nil {
			return total, err
		}
		if werr != nil {
			return total, werr
		}
		if eof {
			return total, nil
		}
		n, err := spliceOnce(dstRC, srcRC)
		total += n
		if err != nil {
			return total, err
		}
	}
}

// spliceOnce moves what src holds now (up to a pipe's worth) into dst through a pooled pipe.
func spliceOnce(dst, src interface {
	Read(func(uintptr) bool) error
	Write(func(uintptr) bool) error
}) (int64, error) {
	p, err := getPipe()
	if err != nil {
		return 0, err
	}
	var in int64
	var serr error
	if err := src.Read(func(fd uintptr) bool {
		in, serr = unix.Splice(int(fd), nil, p[1], nil, pipeChunk, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		return serr != unix.EAGAIN && serr != unix.EINTR
	}); err != nil {
		putPipe(p, false)
		return 0, err
	}
	if serr != nil || in == 0 {
		// Nothing moved (an EOF the caller's next look sees), or an error: the pipe is still empty.
		putPipe(p, true)
		return 0, serr
	}
	left := in
	for left > 0 {
		var out int64
		if err := dst.Write(func(fd uintptr) bool {
			out, serr = unix.Splice(p[0], nil, int(fd), nil, int(left), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			return serr != unix.EAGAIN && serr != unix.EINTR
		}); err != nil {
			putPipe(p, false) // bytes may be left in it
			return in - left, err
		}
		if serr != nil {
			putPipe(p, false)
			return in - left, serr
		}
		left -= out
	}
	putPipe(p, true)
	return in, nil
}

// pipeChunk is the most moved per splice: the default pipe capacity.
const pipeChunk = 64 << 10

// pipes is a small pool of empty pipes ([read, write] descriptors).
var pipes = make(chan [2]int, 64)

func getPipe() ([2]int, error) {
	select {
	case p := <-pipes:
		return p, nil
	default:
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return p, errors.Join(errors.New("creating a pipe for splice"), err)
	}
	return p, nil
}

// putPipe returns an empty pipe to the pool, or closes it (when not known empty, or the pool is full).
func putPipe(p [2]int, empty bool) {
	if empty {
		select {
		case pipes <- p:
			return
		default:
		}
	}
	_ = unix.Close(p[0])
	_ = unix.Close(p[1])
}
