package conntrack

import (
	"errors"
	"runtime"
	"time"

	"kube-proxy/config"
	"kube-proxy/rules/sysctl"
)

// maxLimit caps the scaled nf_conntrack_max, as upstream does.
const maxLimit = 1 << 20

// SetSysctls applies the conntrack section of the configuration with upstream's rules: nf_conntrack_max
// is raised (never lowered) to maxPerCore × CPUs (at least min, at most 2^20) and the hash table to a
// quarter of it, unless maxPerCore is 0; each timeout is written only when set to a positive value;
// tcpBeLiberal is written only when true. nf_conntrack_max and the hash size are global to the host:
// configs for test namespaces set maxPerCore 0.
func SetSysctls(c config.ConntrackConfiguration) error {
	var errs []error
	if max := conntrackMax(c, runtime.NumCPU()); max > 0 {
		if cur, err := sysctl.Get("net/netfilter/nf_conntrack_max"); err != nil || cur < max {
			errs = append(errs, sysctl.Set("net/netfilter/nf_conntrack_max", max))
		}
		errs = append(errs, raiseHashsize(max/4))
	}
	seconds := func(d time.Duration) int { return int(d / time.Second) }
	if d := c.TCPEstablishedTimeout; d != nil && d.Duration > 0 {
		errs = append(errs, sysctl.Set("net/netfilter/nf_conntrack_tcp_timeout_established", seconds(d.Duration)))
	}
	if d := c.TCPCloseWaitTimeout; d != nil && d.Duration > 0 {
		errs = append(errs, sysctl.Set("net/netfilter/nf_conntrack_tcp_timeout_close_wait", seconds(d.Duration)))
	}
	if c.TCPBeLiberal {
		errs = append(errs, sysctl.Set("net/netfilter/nf_conntrack_tcp_be_liberal", 1))
	}
	if d := c.UDPTimeout.Duration; d > 0 {
		errs = append(errs, sysctl.Set("net/netfilter/nf_conntrack_udp_timeout", seconds(d)))
	}
	if d := c.UDPStreamTimeout.Duration; d > 0 {
		errs = append(errs, sysctl.Set("net/netfilter/nf_conntrack_udp_timeout_stream", seconds(d)))
	}
	return errors.Join(errs...)
}

// conntrackMax is the nf_conntrack_max the configuration asks for (0: leave it alone).
func conntrackMax(c config.ConntrackConfiguration, cpus int) int {
	if c.MaxPerCore == nil || *c.MaxPerCore <= 0 {
		return 0
	}
	floor := 0
	if c.Min != nil {
		floor = int(*c.Min)
	}
	return min(max(int(*c.MaxPerCore)*cpus, floor), maxLimit)
}
