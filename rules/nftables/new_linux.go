package nftables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	gnft "github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/rules/internal/syncstate"
)

// New returns the dataplane of cfg.Family (cfg comes from ConfigFrom), writing to the kernel over netlink.
func New(ncfg Config, c cleaner, m *Metrics) (*Dataplane, error) {
	family := ncfg.Family
	k, err := newNetlinkKernel(familyOf(family), netns.None())
	if err != nil {
		return nil, err
	}
	d := newDataplane(ncfg, k, c, m)
	if ncfg.LocalhostReject {
		if m.localhost == nil {
			return nil, fmt.Errorf("the %s localhost NodePort metrics were not registered (NewMetrics without localhost)", family)
		}
		m.localhost.add(family, k)
		d.localhost = newLocalhostProxy(family, m.localhostFor(family))
	}
	return d, nil
}

// minKernel is the oldest kernel mode nftables runs on, as upstream: 5.13 (nft 1.0.1 and the kernel
// features its rules use). KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK skips the check, as upstream.
var minKernel = [2]int{5, 13}

var nftVersion = regexp.MustCompile(`v(\d+)\.(\d+)\.(\d+)`)

// Usable checks that this node can run mode nftables and names what is missing: a kernel of 5.13 or
// later and nft 1.0.1 or later (older nft may crash on the rules this mode writes when an operator lists
// them), as upstream requires.
func Usable() error {
	var problems []string
	if os.Getenv("KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK") == "" {
		var u unix.Utsname
		if err := unix.Uname(&u); err != nil {
			problems = append(problems, fmt.Sprintf("cannot read the kernel version: %v", err))
		} else if rel := unix.ByteSliceToString(u.Release[:]); !atLeast(rel, minKernel[0], minKernel[1], 0) {
			problems = append(problems, fmt.Sprintf("kernel %s is older than %d.%d (set KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK=1 to try anyway)", rel, minKernel[0], minKernel[1]))
		}
	}
	out, err := exec.Command("nft", "--version").Output()
	switch {
	case errors.Is(err, exec.ErrNotFound):
		problems = append(problems, "the nft command is not installed (package nftables, version 1.0.1 or later)")
	case err != nil:
		problems = append(problems, fmt.Sprintf("nft --version failed: %v", err))
	default:
		if v := strings.TrimSpace(string(out)); !atLeast(v, 1, 0, 1) {
			problems = append(problems, fmt.Sprintf("%s is older than nft 1.0.1", v))
		}
	}
	c, err := gnft.New()
	if err == nil {
		_, err = c.ListTablesOfFamily(gnft.TableFamilyIPv4)
	}
	if err != nil {
		problems = append(problems, fmt.Sprintf("cannot use nf_tables over netlink: %v", err))
	}
	if len(problems) > 0 {
		return fmt.Errorf("mode nftables cannot run here: %s", strings.Join(problems, "; "))
	}
	return nil
}

// atLeast reports whether the first x.y.z in s is at least major.minor.patch (x.y counts as x.y.0).
func atLeast(s string, major, minor, patch int) bool {
	m := regexp.MustCompile(`(\d+)\.(\d+)(?:\.(\d+))?`).FindStringSubmatch(s)
	if m == nil {
		return false
	}
	got := [3]int{}
	for i := range 3 {
		got[i], _ = strconv.Atoi(m[i+1])
	}
	want := [3]int{major, minor, patch}
	for i := range 3 {
		if got[i] != want[i] {
			return got[i] > want[i]
		}
	}
	return true
}

// FamilyUsable reports why a family cannot be programmed: IPv6 needs the kernel's IPv6 enabled (upstream
// runs single-stack otherwise).
func FamilyUsable(family v1.IPFamily) error {
	if family != v1.IPv6Protocol {
		return nil
	}
	if _, err := os.Stat("/proc/net/if_inet6"); err != nil {
		return fmt.Errorf("the kernel has no IPv6")
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6"); err == nil && strings.TrimSpace(string(b)) == "1" {
		return fmt.Errorf("IPv6 is disabled (net.ipv6.conf.all.disable_ipv6=1)")
	}
	return nil
}

// Cleanup deletes the kube-proxy tables of both families, ours or upstream's.
func Cleanup(ctx context.Context) error {
	var errs []error
	for _, f := range []*family{familyIPv4, familyIPv6} {
		k, err := newNetlinkKernel(f, netns.None())
		if err != nil {
			return err
		}
		ks, err := k.Read(ctx)
		if err == nil && ks != nil {
			t := newTx(f)
			t.add(op{kind: opDelete, table: true})
			err = k.Run(ctx, t)
			if err == nil {
				klog.InfoS("Removed the nftables table", "table", f.name+" "+TableName)
			}
		}
		k.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", f.name, TableName, err))
		}
	}
	return errors.Join(errs...)
}

// watchInterval is how often the watcher checks that the table is still there.
const watchInterval = 2 * time.Second

// Watch asks for a sync (partial) once chains flushed by a sync are due for deletion, as upstream deletes
// them a second later even when nothing else changes. And it checks every couple of seconds that the
// table exists: when someone deleted it (`nft flush ruleset`, a firewall reload), it logs that, counts it
// and asks for a rewrite, without waiting for the periodic sync.
func (d *Dataplane) Watch(ctx context.Context, _ time.Duration, sync func(full bool)) {
	var lister *gnft.Conn
	if _, ok := d.kernel.(*netlinkKernel); ok {
		c, err := gnft.New()
		if err != nil {
			klog.ErrorS(err, "Not watching the nftables table", "ipFamily", d.family)
		} else {
			lister = c
		}
	}
	tick := time.NewTicker(watchInterval)
	defer tick.Stop()
	var staleTimer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.staleFlushed:
			staleTimer = time.After(staleAfter + 50*time.Millisecond)
			continue
		case <-staleTimer:
			staleTimer = nil
			sync(false)
			continue
		case <-tick.C:
		}
		if lister != nil && d.tableDeleted(lister) {
			sync(true)
		}
	}
}

// tableDeleted reports whether the table is gone while the dataplane believes it written; it then logs
// and counts that once and makes the next sync a rebuild. It takes turns with Apply, so that the periodic
// check and the watcher do not both count one deletion.
func (d *Dataplane) tableDeleted(c *gnft.Conn) bool {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	if !d.state.Synced() {
		return false
	}
	if _, err := c.ListTableOfFamily(TableName, d.kernel.(*netlinkKernel).table().Family); err == nil || !isNotFound(err) {
		return false
	}
	d.state.MarkFull()
	syncstate.ChangedExternally(d.metrics.removedExternally, d.family, "nftables table", "the table is gone")
	return true
}

func isNotFound(err error) bool {
	return errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "no such file") || strings.Contains(err.Error(), "expected table count")
}

// newLocalhostCollector returns the collector of the rejected loopback NodePort packets,
// upstream's kubeproxy_nftables_localhost_nodeport_rejected_packets_total: the counters of each family's
// table (added as the dataplanes are made), read from the kernel at each scrape.
func newLocalhostCollector() localhostCollector {
	return &localhostCounters{kernels: map[v1.IPFamily]*netlinkKernel{},
		desc: prometheus.NewDesc("kubeproxy_nftables_localhost_nodeport_rejected_packets_total",
			"[ALPHA] Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running",
			[]string{"ip_family", "protocol"}, nil)}
}

// localhostCounters is the collector of the loopback NodePort reject counters.
type localhostCounters struct {
	desc    *prometheus.Desc
	mu      sync.Mutex
	kernels map[v1.IPFamily]*netlinkKernel
	conn    *gnft.Conn
}

func (c *localhostCounters) add(family v1.IPFamily, k kernel) {
	if nk, ok := k.(*netlinkKernel); ok {
		c.mu.Lock()
		c.kernels[family] = nk
		c.mu.Unlock()
	}
}

func (c *localhostCounters) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect reads the counters from the kernel.
func (c *localhostCounters) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		conn, err := gnft.New()
		if err != nil {
			return
		}
		c.conn = conn
	}
	for family, k := range c.kernels {
		objs, err := c.conn.GetObjects(k.table())
		if err != nil {
			continue
		}
		for _, o := range objs {
			co, ok := o.(*gnft.CounterObj)
			if !ok {
				continue
			}
			for _, p := range localhostProtocols {
				if co.Name == LocalhostRejectCounter(p) {
					ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(co.Packets), string(family), string(p))
				}
			}
		}
	}
}
