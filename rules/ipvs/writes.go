package ipvs

import (
	"fmt"
	"net/netip"
	"sync/atomic"
)

// writes counts the kernel objects a dataplane wrote (created, changed or removed), by kind. A full sync
// of a kernel that already matches the desired state writes none: each sync's log line says how many it wrote,
// which tells a resync that repaired something from one that only read. (The iptables rules are restored
// by every full sync and are not counted.) Reconfigure's scheduler probe writes outside d.mu, hence the
// atomics; its virtual server may then count in a sync's writes.
type writes struct {
	vs, reals, members, addrs atomic.Int64
}

// writeCounts is a reading of writes.
type writeCounts struct{ vs, reals, members, addrs int64 }

func (w *writes) read() writeCounts {
	return writeCounts{w.vs.Load(), w.reals.Load(), w.members.Load(), w.addrs.Load()}
}

func (c writeCounts) sub(o writeCounts) writeCounts {
	return writeCounts{c.vs - o.vs, c.reals - o.reals, c.members - o.members, c.addrs - o.addrs}
}

func (c writeCounts) total() int64 { return c.vs + c.reals + c.members + c.addrs }

// String is "0" or the non-zero kinds, such as "realServers=3 setMembers=1".
func (c writeCounts) String() string {
	if c.total() == 0 {
		return "0"
	}
	s := ""
	for _, k := range []struct {
		name string
		n    int64
	}{{"virtualServers", c.vs}, {"realServers", c.reals}, {"setMembers", c.members}, {"addresses", c.addrs}} {
		if k.n != 0 {
			if s != "" {
				s += " "
			}
			s += fmt.Sprintf("%s=%d", k.name, k.n)
		}
	}
	return s
}

// counted returns k with its IPVS, set and link handles counting their writes in w.
func counted(k kernel, w *writes) kernel {
	k.ipvs = countedIPVS{k.ipvs, w}
	k.sets = countedSets{k.sets, w}
	k.links = countedLinks{k.links, w}
	return k
}

type countedIPVS struct {
	ipvsHandle
	w *writes
}

func (c countedIPVS) createService(vs kernelVS) error {
	c.w.vs.Add(1)
	return c.ipvsHandle.createService(vs)
}

func (c countedIPVS) updateService(vs kernelVS) error {
	c.w.vs.Add(1)
	return c.ipvsHandle.updateService(vs)
}

func (c countedIPVS) removeService(k vsKey) error {
	c.w.vs.Add(1)
	return c.ipvsHandle.removeService(k)
}

func (c countedIPVS) createReal(k vsKey, r realKey, weight uint32) error {
	c.w.reals.Add(1)
	return c.ipvsHandle.createReal(k, r, weight)
}

func (c countedIPVS) updateReal(k vsKey, r realKey, weight uint32) error {
	c.w.reals.Add(1)
	return c.ipvsHandle.updateReal(k, r, weight)
}

func (c countedIPVS) removeReal(k vsKey, r realKey) error {
	c.w.reals.Add(1)
	return c.ipvsHandle.removeReal(k, r)
}

type countedSets struct {
	setHandle
	w *writes
}

func (c countedSets) addEntry(name, typ string, e entry) error {
	c.w.members.Add(1)
	return c.setHandle.addEntry(name, typ, e)
}

func (c countedSets) delEntry(name, typ string, e entry) error {
	c.w.members.Add(1)
	return c.setHandle.delEntry(name, typ, e)
}

type countedLinks struct {
	linkHandle
	w *writes
}

func (c countedLinks) addAddr(link string, a netip.Addr) error {
	c.w.addrs.Add(1)
	return c.linkHandle.addAddr(link, a)
}

func (c countedLinks) delAddr(link string, a netip.Addr) error {
	c.w.addrs.Add(1)
	return c.linkHandle.delAddr(link, a)
}
