package engine

import "golang.org/x/sys/unix"

// defaultMaxConns leaves 1,024 descriptors of RLIMIT_NOFILE to everything else and allows two per
// connection (client and upstream sockets), at least 64.
func defaultMaxConns() int {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil || r.Cur == unix.RLIM_INFINITY {
		return 1 << 20
	}
	return max(int(r.Cur)-1024, 128) / 2
}
