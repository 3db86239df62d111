package probe

import (
	"time"

	"kube-proxy/e2e/floor"
)

// Failures counts the failed connections of res.
func Failures(res []HitResult) int {
	n := 0
	for _, r := range res {
		if r.Err != "" {
			n++
		}
	}
	return n
}

// WithinFloor reports whether every failed connection of res (none, too) is excused by the host's noise
// floor: the rule of package kube-proxy/e2e/floor.
func WithinFloor(res []HitResult) bool {
	return floor.Excused(len(res), func(i int) string { return res[i].Err }) == Failures(res)
}

// Reachable calls try until it succeeds, 20 ms apart, and returns how long that took from the first
// call; once limit has passed it gives up with try's last error.
func Reachable(limit time.Duration, try func() error) (time.Duration, error) {
	start := time.Now()
	for {
		err := try()
		if err == nil {
			return time.Since(start), nil
		}
		if took := time.Since(start); took > limit {
			return took, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
