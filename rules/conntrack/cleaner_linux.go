package conntrack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/proxy"
)

// Cleaner deletes stale UDP and SCTP entries from the kernel's conntrack table over netlink.
type Cleaner struct {
	family   v1.IPFamily
	duration prometheus.Observer
	deleted  prometheus.Counter
	// deleteFlows deletes the entries of a family's table that f matches and returns how many
	// (netlink.ConntrackDeleteFilters; a test's simulated table).
	deleteFlows func(family netlink.InetFamily, f netlink.CustomConntrackFilter) (uint, error)
}

// Metrics are the conntrack cleanup metrics, under upstream's names.
type Metrics struct {
	Duration *prometheus.HistogramVec
	Deleted  *prometheus.CounterVec
}

// NewMetrics registers the conntrack metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "kubeproxy",
			Name: "conntrack_reconciler_sync_duration_seconds", Help: "[ALPHA] ReconcileConntrackFlowsLatency latency in seconds",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}, []string{"ip_family"}),
		Deleted: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "kubeproxy",
			Name: "conntrack_reconciler_deleted_entries_total", Help: "[ALPHA] Cumulative conntrack flows deleted by conntrack reconciler"},
			[]string{"ip_family"}),
	}
	reg.MustRegister(m.Duration, m.Deleted)
	return m
}

// NewCleaner returns a Cleaner for one IP family.
func NewCleaner(family v1.IPFamily, m *Metrics) *Cleaner {
	return &Cleaner{family: family, duration: m.Duration.WithLabelValues(string(family)), deleted: m.Deleted.WithLabelValues(string(family)),
		deleteFlows: func(family netlink.InetFamily, f netlink.CustomConntrackFilter) (uint, error) {
			return netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, f)
		}}
}

// Clean deletes the entries that are stale for snap. A partial listing (the kernel interrupts long dumps)
// still cleans what it saw. Every call is a run of the reconciler that
// kubeproxy_conntrack_reconciler_sync_duration_seconds observes, as upstream observes each of its runs:
// without a UDP or SCTP Service nothing can be stale, and the table is not read.
func (c *Cleaner) Clean(snap *proxy.Snapshot) error {
	start := time.Now()
	stale := NewStale(snap)
	var n uint
	var err error
	if !stale.Empty() {
		family := netlink.InetFamily(unix.AF_INET)
		if c.family == v1.IPv6Protocol {
			family = unix.AF_INET6
		}
		n, err = c.deleteFlows(family, netlinkFilter{stale})
	}
	c.duration.Observe(time.Since(start).Seconds())
	c.deleted.Add(float64(n))
	if n > 0 {
		klog.V(2).InfoS("Deleted stale conntrack entries", "ipFamily", c.family, "entries", n)
	}
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("deleting stale %s conntrack entries: %w", c.family, err)
	}
	return nil
}

// netlinkFilter adapts Stale to the netlink library's filter interface.
type netlinkFilter struct{ s *Stale }

func (f netlinkFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	p := flow.Forward.Protocol
	if p != protoUDP && p != protoSCTP {
		return false
	}
	return f.s.IsStale(Flow{
		Protocol: p,
		OrigDst:  addrPort(flow.Forward.DstIP, flow.Forward.DstPort),
		ReplySrc: addrPort(flow.Reverse.SrcIP, flow.Reverse.SrcPort),
	})
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}
