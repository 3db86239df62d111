package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/iptables/iptrace"
)

// The fakes simulate the kernel objects the writer manages: they keep state, and fail as the kernel does
// for duplicate and missing objects. They do not count calls; tests look at the state they end up in.

// fakeIPVS is the kernel's IPVS table (shared by both families, as in the kernel).
type fakeIPVS struct {
	vs       map[vsKey]*fakeVS
	timeouts [3]uint32
	// fail, when set, is consulted before every write and may return an error to inject.
	fail func(op string, k vsKey) error
	// noAllReals makes allReals unsupported, so real servers are listed per virtual server.
	noAllReals bool
	// failTimeouts, when set, is what setting the timeouts returns.
	failTimeouts error
}

type fakeVS struct {
	kernelVS
	reals map[realKey]*kernelReal
}

func newFakeIPVS() *fakeIPVS { return &fakeIPVS{vs: map[vsKey]*fakeVS{}} }

func (f *fakeIPVS) check(op string, k vsKey) error {
	if f.fail != nil {
		return f.fail(op, k)
	}
	return nil
}

func (f *fakeIPVS) services() ([]kernelVS, error) {
	out := make([]kernelVS, 0, len(f.vs))
	for _, v := range f.vs {
		out = append(out, v.kernelVS)
	}
	slices.SortFunc(out, func(a, b kernelVS) int { return a.key.compare(b.key) })
	return out, nil
}

func (f *fakeIPVS) createService(vs kernelVS) error {
	if err := f.check("createService", vs.key); err != nil {
		return err
	}
	if _, ok := f.vs[vs.key]; ok {
		return fmt.Errorf("%w: file exists", errExist)
	}
	if vs.scheduler == "" || vs.scheduler == "nope" {
		return fmt.Errorf("no such file or directory (scheduler %q)", vs.scheduler)
	}
	f.vs[vs.key] = &fakeVS{kernelVS: vs, reals: map[realKey]*kernelReal{}}
	return nil
}

func (f *fakeIPVS) updateService(vs kernelVS) error {
	if err := f.check("updateService", vs.key); err != nil {
		return err
	}
	v, ok := f.vs[vs.key]
	if !ok {
		return fmt.Errorf("%w: no such process", errNotExist)
	}
	v.kernelVS = vs
	return nil
}

func (f *fakeIPVS) removeService(k vsKey) error {
	if err := f.check("removeService", k); err != nil {
		return err
	}
	if _, ok := f.vs[k]; !ok {
		return fmt.Errorf("%w: no such process", errNotExist)
	}
	delete(f.vs, k)
	return nil
}

func (f *fakeIPVS) reals(k vsKey) ([]kernelReal, error) {
	v, ok := f.vs[k]
	if !ok {
		return nil, nil // the kernel's dump of a missing service is empty
	}
	out := make([]kernelReal, 0, len(v.reals))
	for _, r := range v.reals {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b kernelReal) int { return a.key.compare(b.key) })
	return out, nil
}

func (f *fakeIPVS) allReals() (map[vsKey][]kernelReal, error) {
	if f.noAllReals {
		return nil, nil
	}
	out := map[vsKey][]kernelReal{}
	for k := range f.vs {
		out[k], _ = f.reals(k)
	}
	return out, nil
}

func (f *fakeIPVS) createReal(k vsKey, r realKey, w uint32) error {
	if err := f.check("createReal", k); err != nil {
		return err
	}
	v, ok := f.vs[k]
	if !ok {
		return fmt.Errorf("%w: no such process", errNotExist)
	}
	if _, ok := v.reals[r]; ok {
		return fmt.Errorf("%w: file exists", errExist)
	}
	v.reals[r] = &kernelReal{key: r, weight: w}
	return nil
}

func (f *fakeIPVS) updateReal(k vsKey, r realKey, w uint32) error {
	if err := f.check("updateReal", k); err != nil {
		return err
	}
	v, ok := f.vs[k]
	if !ok {
		return fmt.Errorf("%w: no such process", errNotExist)
	}
	rs, ok := v.reals[r]
	if !ok {
		return fmt.Errorf("%w: no such file or directory", errNotExist)
	}
	rs.weight = w
	return nil
}

func (f *fakeIPVS) removeReal(k vsKey, r realKey) error {
	if err := f.check("removeReal", k); err != nil {
		return err
	}
	v, ok := f.vs[k]
	if !ok {
		return fmt.Errorf("%w: no such process", errNotExist)
	}
	if _, ok := v.reals[r]; !ok {
		return fmt.Errorf("%w: no such file or directory", errNotExist)
	}
	delete(v.reals, r)
	return nil
}

func (f *fakeIPVS) setTimeouts(tcp, tcpFin, udp uint32) error {
	if f.failTimeouts != nil {
		return f.failTimeouts
	}
	for i, v := range []uint32{tcp, tcpFin, udp} {
		if v != 0 {
			f.timeouts[i] = v
		}
	}
	return nil
}

// conns sets the connection counts of a real server (a test's stand-in for traffic).
func (f *fakeIPVS) conns(k vsKey, r realKey, active, inactive uint32) {
	rs := f.vs[k].reals[r]
	rs.active, rs.inactive = active, inactive
}

// fakeSets are the kernel's ipsets.
type fakeSets struct {
	sets map[string]*fakeSet
}

type fakeSet struct {
	typ     string
	family  v1.IPFamily
	entries map[entry]bool
}

func newFakeSets() *fakeSets { return &fakeSets{sets: map[string]*fakeSet{}} }

func (f *fakeSets) createSet(name, typ string, family v1.IPFamily) error {
	if len(name) > maxSetName {
		return fmt.Errorf("set name %q too long", name)
	}
	if _, ok := f.sets[name]; ok {
		return fmt.Errorf("%w: set with the same name already exists", errExist)
	}
	f.sets[name] = &fakeSet{typ: typ, family: family, entries: map[entry]bool{}}
	return nil
}

func (f *fakeSets) destroySet(name string) error {
	if _, ok := f.sets[name]; !ok {
		return fmt.Errorf("%w: the set with the given name does not exist", errNotExist)
	}
	delete(f.sets, name)
	return nil
}

func (f *fakeSets) listSet(name string) ([]entry, error) {
	s, ok := f.sets[name]
	if !ok {
		return nil, fmt.Errorf("%w: the set with the given name does not exist", errNotExist)
	}
	out := make([]entry, 0, len(s.entries))
	for e := range s.entries {
		out = append(out, e)
	}
	slices.SortFunc(out, entry.compare)
	return out, nil
}

// fits reports whether an entry has exactly the fields the set type takes, in the set's family.
func (s *fakeSet) fits(e entry) bool {
	famOK := func(a ipAddr) bool { return familyOf(a.addr()) == s.family }
	switch s.typ {
	case typeBitmapPort:
		return !e.ip.IsValid() && e.proto == 0 && !e.third.IsValid()
	case typeHashIP:
		return e.ip.IsValid() && famOK(e.ip) && e.proto == 0 && e.port == 0
	case typeHashIPPort:
		return e.ip.IsValid() && famOK(e.ip) && e.proto != 0 && !e.third.IsValid()
	case typeHashIPPortIP:
		return e.ip.IsValid() && famOK(e.ip) && e.proto != 0 && !e.isNet && e.third.IsValid() && famOK(e.third)
	case typeHashIPPortNet:
		return e.ip.IsValid() && famOK(e.ip) && e.proto != 0 && e.isNet && e.third.IsValid() && famOK(e.third)
	}
	return false
}

func (f *fakeSets) addEntry(name, typ string, e entry) error {
	s, ok := f.sets[name]
	if !ok {
		return fmt.Errorf("%w: the set with the given name does not exist", errNotExist)
	}
	if typ != s.typ || !s.fits(e) {
		return fmt.Errorf("entry %s does not fit set %s of type %s", e, name, s.typ)
	}
	if s.entries[e] {
		return fmt.Errorf("%w: element is already added", errExist)
	}
	s.entries[e] = true
	return nil
}

func (f *fakeSets) delEntry(name, typ string, e entry) error {
	s, ok := f.sets[name]
	if !ok {
		return fmt.Errorf("%w: the set with the given name does not exist", errNotExist)
	}
	if !s.entries[e] {
		return fmt.Errorf("%w: element is not added", errNotExist)
	}
	delete(s.entries, e)
	return nil
}

// fakeLinks are the node's links and addresses.
type fakeLinks struct {
	links map[string]map[netip.Addr]bool
	// events, when set, stands for the kernel's address notifications: watchAddrs calls changed for
	// every nil received (then sends on handled), and fails with a non-nil one.
	events  chan error
	handled chan struct{}
}

func newFakeLinks(eth0 ...string) *fakeLinks {
	f := &fakeLinks{links: map[string]map[netip.Addr]bool{"lo": {netip.MustParseAddr("127.0.0.1"): true, netip.MustParseAddr("::1"): true}, "eth0": {}}}
	for _, a := range eth0 {
		f.links["eth0"][netip.MustParseAddr(a)] = true
	}
	return f
}

func (f *fakeLinks) ensureDummy(name string) error {
	if _, ok := f.links[name]; !ok {
		f.links[name] = map[netip.Addr]bool{}
	}
	return nil
}

func (f *fakeLinks) deleteLink(name string) error {
	if _, ok := f.links[name]; !ok {
		return fmt.Errorf("%w: Link not found", errNotExist)
	}
	delete(f.links, name)
	return nil
}

func (f *fakeLinks) addrs(link string, family v1.IPFamily) ([]netip.Addr, error) {
	l, ok := f.links[link]
	if !ok {
		return nil, fmt.Errorf("Link not found")
	}
	var out []netip.Addr
	for a := range l {
		if familyOf(a) == family {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

func (f *fakeLinks) addAddr(link string, a netip.Addr) error {
	l, ok := f.links[link]
	if !ok {
		return fmt.Errorf("Link not found")
	}
	if l[a] {
		return fmt.Errorf("%w: file exists", errExist)
	}
	l[a] = true
	return nil
}

func (f *fakeLinks) delAddr(link string, a netip.Addr) error {
	l, ok := f.links[link]
	if !ok {
		return fmt.Errorf("Link not found")
	}
	if !l[a] {
		return fmt.Errorf("%w: cannot assign requested address", errNotExist)
	}
	delete(l, a)
	return nil
}

func (f *fakeLinks) watchAddrs(ctx context.Context, _ v1.IPFamily, changed func()) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-f.events:
			if err != nil {
				return err
			}
			changed()
			f.handled <- struct{}{}
		}
	}
}

func (f *fakeLinks) localAddrs(family v1.IPFamily, except string) ([]netip.Addr, error) {
	var out []netip.Addr
	for name, l := range f.links {
		if name == except {
			continue
		}
		for a := range l {
			if familyOf(a) == family {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// fakeRules is one family's iptables: iptrace's model of the kernel's tables, which applies
// iptables-restore payloads and iptables commands as the real tools do and refuses what they refuse,
// rules naming a missing ipset included (the fake sets of the family are handed to it before each
// write). The same model traces packets through the rules (trace_test.go).
type fakeRules struct {
	family v1.IPFamily
	ts     *iptrace.Tables
	sets   *fakeSets
	fail   error
	// failSaves, when positive, makes that many saves fail.
	failSaves int
}

func newFakeRules(family v1.IPFamily, sets *fakeSets) *fakeRules {
	return &fakeRules{family: family, ts: iptrace.New(family == v1.IPv6Protocol), sets: sets}
}

// syncSets gives the model the fake kernel's sets of the family, as they are now.
func (f *fakeRules) syncSets() error {
	for name, s := range f.sets.sets {
		if s.family != f.family {
			continue
		}
		members := make([]string, 0, len(s.entries))
		for e := range s.entries {
			members = append(members, e.String())
		}
		if err := f.ts.SetIPSet(name, s.typ, members...); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeRules) restore(_ context.Context, payload []byte) error {
	if f.fail != nil {
		return f.fail
	}
	if err := f.syncSets(); err != nil {
		return err
	}
	return f.ts.Restore(payload, iptrace.RestoreOptions{NoFlush: true})
}

func (f *fakeRules) save(_ context.Context, table string) (string, error) {
	if f.fail != nil {
		return "", f.fail
	}
	if f.failSaves > 0 {
		f.failSaves--
		return "", fmt.Errorf("iptables-save -t %s: table does not exist", table)
	}
	return f.ts.Save(table), nil
}

// dump writes the tables as iptables-save does.
func (f *fakeRules) dump() string { return f.ts.SaveAll() }

// fakeSysctls are the parameters IPVS mode writes, as files of a test's directory standing for /proc/sys
// (the dataplane writes them through the sysctl.Tree it is given, as in production).
var fakeSysctls = map[string]string{
	"net/ipv4/vs/conntrack":                 "0",
	"net/ipv4/vs/expire_nodest_conn":        "0",
	"net/ipv4/vs/expire_quiescent_template": "0",
	"net/ipv4/vs/conn_reuse_mode":           "1",
	"net/ipv4/ip_forward":                   "0",
	"net/ipv4/conf/all/arp_ignore":          "0",
	"net/ipv4/conf/all/arp_announce":        "0",
}

// fakeSysctl is a directory of kernel parameters.
type fakeSysctl struct {
	t    testing.TB
	root string
}

func newFakeSysctl(t testing.TB) fakeSysctl {
	f := fakeSysctl{t: t, root: t.TempDir()}
	for name, v := range fakeSysctls {
		p := filepath.Join(f.root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// get reads a parameter.
func (f fakeSysctl) get(name string) string {
	b, err := os.ReadFile(filepath.Join(f.root, name))
	if err != nil {
		f.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
