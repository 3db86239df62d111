package engine

import "golang.org/x/sys/unix"

// DefaultDescriptors is the descriptor budget of engines: RLIMIT_NOFILE less 1,024 kept for everything
// else, at least 256.
func DefaultDescriptors() int {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil || r.Cur == unix.RLIM_INFINITY {
		return 1 << 21
	}
	return max(int(r.Cur)-1024, 256)
}
