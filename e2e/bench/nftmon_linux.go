package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"kube-proxy/e2e/harness"
)

// The observer: a netlink socket in the node namespace subscribed to nf_tables' multicast group, the
// channel `nft monitor` listens on. iptables-nft commits every iptables-restore table as one nf_tables
// transaction; the kernel then announces each added or deleted chain and rule, followed by a "new
// generation" message naming the committing process. The monitor keeps, for every chain of the IPv4 nat
// table, the jump (or goto) target of each rule, by rule handle, and after each generation message it
// evaluates what callers wait for. Nothing is polled and no text is formatted, so the observer costs the
// host little; the kernel builds the notifications only because a listener exists, in the committing
// process (measured: see BENCHMARKS.md). For mode nftables the same notifications (sets and their
// elements too) feed a model of the IPv4 table kube-proxy (nftmodel_linux.go).

// Message types, attributes and flags of nf_tables netlink not in x/sys/unix.
const (
	nftMsgGetRule   = 7
	nftaGenProcName = 3
	nlmFDumpIntr    = 0x10
	nftaTypeMask    = 0x3fff  // attribute type without NLA_F_NESTED / NLA_F_NET_BYTEORDER
	monitorRcvBuf   = 1 << 30 // generous: a 10k-Service cold sync announces some 200k rules at once
	nlmsgHeaderSize = unix.SizeofNlMsghdr
	nfgenmsgSize    = 4
)

// Gen is one committed nf_tables transaction as the monitor saw it.
type Gen struct {
	// ID is the kernel's generation number.
	ID uint32
	// PID and Proc name the committing process (e.g. "iptables-nft-re").
	PID  int
	Proc string
	// Time is when the monitor read the generation message: the transaction was in effect by then.
	Time time.Time
	// Rules, Chains and Elems count the rules, chains and set or map elements added or deleted in the
	// transaction, all tables and families together (the elements of a set deleted as a whole not
	// included: the kernel announces only the set).
	Rules, Chains, Elems int
	// Resynced is set when the monitor lost notifications (socket overflow) and re-read the kernel's
	// state instead; Time is then when that re-read finished.
	Resynced bool
}

// View is the monitor's model of the IPv4 nat table (and of the IPv4 table kube-proxy), handed to wait
// predicates under the monitor's lock.
type View struct{ m *Monitor }

// NFTReaches returns the endpoints ("ip:port", sorted) that table kube-proxy sends a new TCP connection
// to ip:port to: through the service-ips map to a chain, and that chain's DNAT rules. None when the map
// has no element for the address and port.
func (v View) NFTReaches(ip netip.Addr, port uint16) []string { return v.m.nft.reaches(ip, port) }

// NFTServiceIPs returns the number of elements of the service-ips map.
func (v View) NFTServiceIPs() int { return len(v.m.nft.sets[nftServiceIPs]) }

// SEPs returns how many of chain's rules jump to a KUBE-SEP chain.
func (v View) SEPs(chain string) int {
	n := 0
	for _, t := range v.m.rules[chain] {
		if strings.HasPrefix(t, "KUBE-SEP-") {
			n++
		}
	}
	return n
}

// Jumps reports whether a rule of chain jumps to target.
func (v View) Jumps(chain, target string) bool {
	for _, t := range v.m.rules[chain] {
		if t == target {
			return true
		}
	}
	return false
}

// Reaches reports whether every chain in chains can be reached from chain from by following jumps and gotos.
func (v View) Reaches(from string, chains []string) bool {
	seen := map[string]bool{from: true}
	queue := []string{from}
	for len(queue) > 0 {
		c := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		for _, t := range v.m.rules[c] {
			if t != "" && !seen[t] {
				seen[t] = true
				queue = append(queue, t)
			}
		}
	}
	for _, c := range chains {
		if !seen[c] {
			return false
		}
	}
	return true
}

type waiter struct {
	pred func(View) bool
	done chan Gen
}

// Monitor watches nf_tables commits inside one network namespace.
type Monitor struct {
	ns        *harness.NetNS
	file      *os.File
	closeOnce sync.Once

	mu      sync.Mutex
	rules   map[string]map[uint64]string // nat chain → rule handle → jump target ("" if none)
	nft     *nftModel                    // the IPv4 table kube-proxy
	waiters []*waiter
	gens    []Gen
	cur     Gen // counts of the transaction being announced
	lost    int // overflows seen
	stopped chan struct{}
	readErr error
}

// NewMonitor subscribes to nf_tables notifications inside ns. Close it when done.
func NewMonitor(ns *harness.NetNS) (*Monitor, error) {
	var fd int
	err := ns.Do(func() error {
		var err error
		fd, err = nlSocket()
		if err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, monitorRcvBuf); err != nil {
			unix.Close(fd)
			return fmt.Errorf("setting the monitor's receive buffer: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, unix.NFNLGRP_NFTABLES); err != nil {
			unix.Close(fd)
			return fmt.Errorf("joining the nf_tables multicast group: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("nf_tables monitor in %s: %w", ns.Name, err)
	}
	m := &Monitor{ns: ns, file: os.NewFile(uintptr(fd), "nftables-monitor"),
		rules: map[string]map[uint64]string{}, nft: newNFTModel(), stopped: make(chan struct{})}
	go m.read()
	return m, nil
}

// nlSocket opens a non-blocking NETLINK_NETFILTER socket in the calling thread's network namespace.
func nlSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
	if err != nil {
		return -1, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("binding netlink socket: %w", err)
	}
	return fd, nil
}

// Close stops the monitor; waiters still pending get no answer. It is idempotent.
func (m *Monitor) Close() error {
	var err error
	m.closeOnce.Do(func() { err = m.file.Close() })
	<-m.stopped
	return err
}

// Lost returns how many times the monitor's socket overflowed (each followed by a re-read of the kernel).
func (m *Monitor) Lost() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lost
}

// GensSince returns the transactions committed at or after t.
func (m *Monitor) GensSince(t time.Time) []Gen {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Gen
	for _, g := range m.gens {
		if !g.Time.Before(t) {
			out = append(out, g)
		}
	}
	return out
}

// Check evaluates pred against the current model.
func (m *Monitor) Check(pred func(View) bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return pred(View{m})
}

// Watch registers pred, to be evaluated after every following transaction; the returned channel yields
// the first transaction after which pred holds. Register before causing the change.
func (m *Monitor) Watch(pred func(View) bool) <-chan Gen {
	w := &waiter{pred: pred, done: make(chan Gen, 1)}
	m.mu.Lock()
	m.waiters = append(m.waiters, w)
	m.mu.Unlock()
	return w.done
}

// WaitFor waits for a channel from Watch, the context, or the monitor's end.
func (m *Monitor) WaitFor(ctx context.Context, ch <-chan Gen) (Gen, error) {
	select {
	case g := <-ch:
		return g, nil
	case <-ctx.Done():
		return Gen{}, ctx.Err()
	case <-m.stopped:
		return Gen{}, fmt.Errorf("nf_tables monitor stopped: %v", m.readErr)
	}
}

// Reload replaces the model of chain (or, with chain "", of the whole nat table) with the kernel's
// current rules, read by a netlink dump. Notifications queued meanwhile are applied afterwards, which is
// harmless: rule handles are never reused, so replaying an add or a delete is idempotent.
func (m *Monitor) Reload(chain string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reloadLocked(chain)
}

func (m *Monitor) reloadLocked(chain string) error {
	rules, err := dumpRules(m.ns, "nat", chain)
	if err != nil {
		return err
	}
	if chain == "" {
		m.rules = map[string]map[uint64]string{}
	} else {
		delete(m.rules, chain)
	}
	for _, r := range rules {
		m.chain(r.chain)[r.handle] = r.target
	}
	return nil
}

// ReloadNFT replaces the model of the given chains of table kube-proxy and of the maps their rules look
// endpoints up in with the kernel's current state; with no chains, of the whole table.
func (m *Monitor) ReloadNFT(chains ...string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reloadNFTLocked(chains)
}

// reloadAllLocked re-reads both models after lost notifications.
func (m *Monitor) reloadAllLocked() error {
	if err := m.reloadLocked(""); err != nil {
		return err
	}
	return m.reloadNFTLocked(nil)
}

func (m *Monitor) reloadNFTLocked(chains []string) error {
	fresh, err := dumpNFT(m.ns, chains)
	if err != nil {
		return err
	}
	if len(chains) == 0 {
		m.nft = fresh
		return nil
	}
	for _, c := range chains {
		delete(m.nft.rules, c)
		if r := fresh.rules[c]; r != nil {
			m.nft.rules[c] = r
		}
	}
	for name, elems := range fresh.sets {
		m.nft.sets[name] = elems
	}
	return nil
}

func (m *Monitor) chain(name string) map[uint64]string {
	c := m.rules[name]
	if c == nil {
		c = map[uint64]string{}
		m.rules[name] = c
	}
	return c
}

func (m *Monitor) read() {
	defer close(m.stopped)
	buf := make([]byte, 1<<20)
	for {
		n, err := m.file.Read(buf)
		now := time.Now()
		if errors.Is(err, unix.ENOBUFS) {
			m.mu.Lock()
			m.lost++
			if err := m.reloadAllLocked(); err != nil {
				m.readErr = fmt.Errorf("re-reading the kernel after an overflow: %w", err)
				m.mu.Unlock()
				return
			}
			m.cur = Gen{Time: time.Now(), Resynced: true}
			m.commitLocked()
			m.mu.Unlock()
			continue
		}
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				m.readErr = err
			}
			return
		}
		m.mu.Lock()
		forEachMsg(buf[:n], func(typ, flags uint16, attrs []byte) {
			m.handle(typ, attrs, now)
		})
		m.mu.Unlock()
	}
}

// handle applies one notification (nfgenmsg stripped) to the models.
func (m *Monitor) handle(typ uint16, msg []byte, now time.Time) {
	if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || len(msg) < nfgenmsgSize {
		return
	}
	family, attrs := msg[0], msg[nfgenmsgSize:]
	typ &= 0xff
	if family == unix.AF_INET {
		m.nft.apply(typ, attrs)
	}
	switch typ {
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		m.cur.Chains++
		if typ == unix.NFT_MSG_DELCHAIN && family == unix.AF_INET && attrString(attrs, unix.NFTA_CHAIN_TABLE) == "nat" {
			delete(m.rules, attrString(attrs, unix.NFTA_CHAIN_NAME))
		}
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		m.cur.Elems += elemCount(attrs)
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		m.cur.Rules++
		if family != unix.AF_INET {
			return
		}
		r, ok := parseRule(attrs, typ == unix.NFT_MSG_NEWRULE)
		if !ok || r.table != "nat" {
			return
		}
		if typ == unix.NFT_MSG_NEWRULE {
			m.chain(r.chain)[r.handle] = r.target
		} else if c := m.rules[r.chain]; c != nil {
			delete(c, r.handle)
		}
	case unix.NFT_MSG_NEWGEN:
		m.cur.Time = now
		forEachAttr(attrs, func(t uint16, v []byte) {
			switch t {
			case unix.NFTA_GEN_ID:
				if len(v) == 4 {
					m.cur.ID = binary.BigEndian.Uint32(v)
				}
			case unix.NFTA_GEN_PROC_PID:
				if len(v) == 4 {
					m.cur.PID = int(binary.BigEndian.Uint32(v))
				}
			case nftaGenProcName:
				m.cur.Proc = cstr(v)
			}
		})
		m.commitLocked()
	}
}

// commitLocked records the current transaction and answers the waiters whose predicate now holds.
func (m *Monitor) commitLocked() {
	g := m.cur
	m.cur = Gen{}
	m.gens = append(m.gens, g)
	kept := m.waiters[:0]
	for _, w := range m.waiters {
		if w.pred(View{m}) {
			w.done <- g
			continue
		}
		kept = append(kept, w)
	}
	m.waiters = kept
}

type rule struct {
	table, chain, target string
	handle               uint64
}

// parseRule extracts table, chain, handle and (when withExprs) the chain an immediate verdict jumps or
// goes to.
func parseRule(attrs []byte, withExprs bool) (rule, bool) {
	var r rule
	var exprs []byte
	forEachAttr(attrs, func(t uint16, v []byte) {
		switch t {
		case unix.NFTA_RULE_TABLE:
			r.table = cstr(v)
		case unix.NFTA_RULE_CHAIN:
			r.chain = cstr(v)
		case unix.NFTA_RULE_HANDLE:
			if len(v) == 8 {
				r.handle = binary.BigEndian.Uint64(v)
			}
		case unix.NFTA_RULE_EXPRESSIONS:
			exprs = v
		}
	})
	if r.chain == "" || r.handle == 0 {
		return r, false
	}
	if withExprs {
		r.target = jumpTarget(exprs)
	}
	return r, true
}

// jumpTarget finds the chain of an "immediate" expression's jump/goto verdict in a rule's expression list.
func jumpTarget(exprs []byte) string {
	target := ""
	forEachAttr(exprs, func(t uint16, elem []byte) {
		if t != unix.NFTA_LIST_ELEM {
			return
		}
		var name string
		var data []byte
		forEachAttr(elem, func(t uint16, v []byte) {
			switch t {
			case unix.NFTA_EXPR_NAME:
				name = cstr(v)
			case unix.NFTA_EXPR_DATA:
				data = v
			}
		})
		if name != "immediate" {
			return
		}
		forEachAttr(data, func(t uint16, v []byte) {
			if t != unix.NFTA_IMMEDIATE_DATA {
				return
			}
			forEachAttr(v, func(t uint16, v []byte) {
				if t != unix.NFTA_DATA_VERDICT {
					return
				}
				forEachAttr(v, func(t uint16, v []byte) {
					if t == unix.NFTA_VERDICT_CHAIN {
						target = cstr(v)
					}
				})
			})
		})
	})
	return target
}

// dumpRules reads the rules of an IPv4 table (of one chain, if chain is set) through a netlink dump in ns.
func dumpRules(ns *harness.NetNS, table, chain string) ([]rule, error) {
	var out []rule
	err := inNetNS(ns, func(c *nlConn) error {
		return c.dump(ruleRequest(table, chain), func() { out = out[:0] }, func(typ uint16, attrs []byte) {
			if r, ok := parseRule(attrs, true); ok && typ == unix.NFT_MSG_NEWRULE {
				out = append(out, r)
			}
		})
	})
	if err != nil {
		return nil, fmt.Errorf("dumping %s rules in %s: %w", table, ns.Name, err)
	}
	return out, nil
}

// nlConn is a netlink socket for dumps, in the network namespace it was opened in.
type nlConn struct {
	fd  int
	seq uint32
	buf []byte
}

// inNetNS opens a netlink socket in ns and runs fn with it (on a thread in ns).
func inNetNS(ns *harness.NetNS, fn func(c *nlConn) error) error {
	return ns.Do(func() error {
		fd, err := nlSocket()
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetNonblock(fd, false); err != nil {
			return err
		}
		return fn(&nlConn{fd: fd, buf: make([]byte, 1<<20)})
	})
}

// dump sends a dump request and calls fn with every nf_tables message of the answer (type without the
// subsystem, nfgenmsg stripped). A dump the kernel marks interrupted by a change (NLM_F_DUMP_INTR) is
// made again, up to ten times, after calling reset. A dump of something that does not exist (ENOENT)
// answers nothing.
func (c *nlConn) dump(req []byte, reset func(), fn func(typ uint16, attrs []byte)) error {
	for attempt := 0; attempt < 10; attempt++ {
		c.seq++
		binary.NativeEndian.PutUint32(req[8:], c.seq)
		if err := unix.Sendto(c.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return fmt.Errorf("sending dump request: %w", err)
		}
		intr, err := c.read(fn)
		if err != nil || !intr {
			return err
		}
		reset()
	}
	return errors.New("dump interrupted by changes ten times in a row")
}

// read reads one dump's answer, calling fn for each message, and reports whether it was interrupted.
func (c *nlConn) read(fn func(typ uint16, attrs []byte)) (bool, error) {
	intr := false
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, 0)
		if err != nil {
			return intr, fmt.Errorf("reading dump: %w", err)
		}
		done := false
		var dumpErr error
		forEachMsg(c.buf[:n], func(typ, flags uint16, msg []byte) {
			switch {
			case typ == unix.NLMSG_DONE:
				done = true
			case typ == unix.NLMSG_ERROR:
				if len(msg) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(msg)); errno != 0 {
						dumpErr = unix.Errno(-errno)
					}
				}
				done = true
			case typ>>8 == unix.NFNL_SUBSYS_NFTABLES && len(msg) >= nfgenmsgSize:
				if flags&nlmFDumpIntr != 0 {
					intr = true
				}
				fn(typ&0xff, msg[nfgenmsgSize:])
			}
		})
		if errors.Is(dumpErr, unix.ENOENT) { // no such table, chain or set: nothing to report
			return false, nil
		}
		if dumpErr != nil {
			return intr, fmt.Errorf("dump: %w", dumpErr)
		}
		if done {
			return intr, nil
		}
	}
}

// strAttr is a string attribute of a request.
type strAttr struct {
	typ uint16
	val string
}

// nftRequest builds an nf_tables dump request of type typ for the IPv4 family with string attributes.
func nftRequest(typ uint16, attrs ...strAttr) []byte {
	b := make([]byte, nlmsgHeaderSize+nfgenmsgSize)
	binary.NativeEndian.PutUint16(b[4:], unix.NFNL_SUBSYS_NFTABLES<<8|typ)
	binary.NativeEndian.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	b[nlmsgHeaderSize] = unix.AF_INET // nfgenmsg: family, version 0, resource id 0
	for _, a := range attrs {
		b = appendAttr(b, a.typ, append([]byte(a.val), 0))
	}
	binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
	return b
}

// ruleRequest builds an NFT_MSG_GETRULE dump request for an IPv4 table, optionally one chain.
func ruleRequest(table, chain string) []byte {
	attrs := []strAttr{{unix.NFTA_RULE_TABLE, table}}
	if chain != "" {
		attrs = append(attrs, strAttr{unix.NFTA_RULE_CHAIN, chain})
	}
	return nftRequest(nftMsgGetRule, attrs...)
}

func appendAttr(b []byte, typ uint16, v []byte) []byte {
	var h [4]byte
	binary.NativeEndian.PutUint16(h[0:], uint16(4+len(v)))
	binary.NativeEndian.PutUint16(h[2:], typ)
	b = append(append(b, h[:]...), v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// forEachMsg calls fn for every netlink message in a datagram with its type, flags and payload.
func forEachMsg(b []byte, fn func(typ, flags uint16, payload []byte)) {
	for len(b) >= nlmsgHeaderSize {
		l := int(binary.NativeEndian.Uint32(b[0:]))
		if l < nlmsgHeaderSize || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[4:]), binary.NativeEndian.Uint16(b[6:]), b[nlmsgHeaderSize:l])
		l = (l + 3) &^ 3
		if l > len(b) {
			return
		}
		b = b[l:]
	}
}

// forEachAttr calls fn for every netlink attribute in b with its type (flags masked off) and value.
func forEachAttr(b []byte, fn func(typ uint16, v []byte)) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:]))
		if l < 4 || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:])&nftaTypeMask, b[4:l])
		l = (l + 3) &^ 3
		if l > len(b) {
			return
		}
		b = b[l:]
	}
}

// cstr returns a NUL-terminated netlink string attribute as a Go string.
func cstr(v []byte) string {
	if i := bytes.IndexByte(v, 0); i >= 0 {
		v = v[:i]
	}
	return string(v)
}
