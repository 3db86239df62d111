package ipvs

import (
	"context"
	"errors"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/internal/syncstate"
	"kube-proxy/rules/sysctl"
)

// The kernel pieces the writer drives, each behind a narrow interface so the writer can be tested against
// fakes (fakes_test.go) that keep state and fail as the kernel does. Implementations report a duplicate
// object with an error wrapping errExist and a missing one with an error wrapping errNotExist.
var (
	errExist    = errors.New("object exists")
	errNotExist = errors.New("no such object")
)

func isExist(err error) bool    { return errors.Is(err, errExist) }
func isNotExist(err error) bool { return errors.Is(err, errNotExist) }

// kernelVS is a virtual server as the kernel reports it.
type kernelVS struct {
	key       vsKey
	scheduler string
	flags     uint32
	timeout   uint32
}

// kernelReal is a real server as the kernel reports it, with its connection counts.
type kernelReal struct {
	key      realKey
	weight   uint32
	active   uint32
	inactive uint32
}

// ipvsHandle manages IPVS virtual and real servers (all families at once, as the kernel's table is shared).
type ipvsHandle interface {
	services() ([]kernelVS, error)
	createService(vs kernelVS) error
	updateService(vs kernelVS) error
	removeService(k vsKey) error
	// reals lists a virtual server's real servers; a missing virtual server has none.
	reals(k vsKey) ([]kernelReal, error)
	// allReals lists the real servers of every virtual server at once (full syncs), or returns nil, nil
	// when it cannot, and the caller asks reals per virtual server.
	allReals() (map[vsKey][]kernelReal, error)
	createReal(k vsKey, r realKey, weight uint32) error
	updateReal(k vsKey, r realKey, weight uint32) error
	removeReal(k vsKey, r realKey) error
	// setTimeouts sets the TCP, TCP-after-FIN and UDP connection timeouts in seconds; 0 keeps a value.
	setTimeouts(tcp, tcpFin, udp uint32) error
}

// setHandle manages ipsets.
type setHandle interface {
	createSet(name, typ string, family v1.IPFamily) error
	destroySet(name string) error
	listSet(name string) ([]entry, error)
	addEntry(name, typ string, e entry) error
	delEntry(name, typ string, e entry) error
}

// linkHandle manages the dummy link and the node's addresses.
type linkHandle interface {
	// ensureDummy creates the dummy link unless it exists.
	ensureDummy(name string) error
	deleteLink(name string) error
	addrs(link string, family v1.IPFamily) ([]netip.Addr, error)
	addAddr(link string, a netip.Addr) error
	delAddr(link string, a netip.Addr) error
	// localAddrs lists the node's addresses of a family on every link but except.
	localAddrs(family v1.IPFamily, except string) ([]netip.Addr, error)
	// watchAddrs calls changed whenever an address of family is added or removed on any link, until ctx is
	// done (nil) or the subscription fails (its error; events may have been lost then).
	watchAddrs(ctx context.Context, family v1.IPFamily, changed func()) error
}

// rulesHandle writes the iptables rules of one family.
type rulesHandle interface {
	// restore feeds payload to iptables-restore --noflush.
	restore(ctx context.Context, payload []byte) error
	// save returns a table as iptables-save prints it.
	save(ctx context.Context, table string) (string, error)
}

// cleaner removes stale conntrack entries after a sync (rules/conntrack).
type cleaner = syncstate.Cleaner

// kernel bundles the handles of one dataplane.
type kernel struct {
	ipvs   ipvsHandle
	sets   setHandle
	links  linkHandle
	rules  rulesHandle
	sysctl sysctl.Tree // /proc/sys of the process's network namespace
	// kernelVersion is the running kernel's version (major, minor), for conn_reuse_mode.
	kernelVersion [2]int
}
