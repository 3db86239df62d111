package inspect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/ipvs"
	"kube-proxy/rules/nfacct"
	"kube-proxy/rules/nftables"
	"kube-proxy/rules/nftables/nftrace"
	"kube-proxy/rules/userspace"
	"kube-proxy/rules/xtables"
)

// Live is the node's kube-proxy state as the kernel holds it now.
type Live struct {
	// Addrs are the node's addresses (both families, loopback included); IfAddrs the addresses of each
	// interface, in the kernel's order (the primary first).
	Addrs   []netip.Addr
	IfAddrs map[string][]netip.Addr
	// XTables holds each iptables backend and family whose tables could be read.
	XTables []*XTables
	// NFT holds the nftables `kube-proxy` tables (families ip and ip6) loaded into the tracer; NFTText the
	// `nft list table` output per family; NFTFamilies the families that have the table.
	NFT         *nftrace.Tables
	NFTText     map[v1.IPFamily]string
	NFTFamilies []v1.IPFamily
	// IPSets are the node's ipsets; IPVS its IPVS virtual servers (mode ipvs).
	IPSets []ipSet
	IPVS   []ipvsService
	// OtherNFTTables are the node's other nftables tables ("inet filter", ...), iptables-nft's excepted.
	OtherNFTTables []string
	// NFAcct are the nfacct counters mode iptables' rules count in: both when the kernel's nfacct answers
	// (the daemon creates them on its first sync, as upstream does), none when it does not.
	NFAcct iptables.NFAcct
	// Problems are what could not be read (a missing tool, a refused command), in words.
	Problems []string
}

// families are the IP families in the order they are read and shown.
var families = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}

// ReadLive reads the kernel's state: addresses, the iptables rules of both backends and families, and the
// nftables tables. What cannot be read is noted in Problems; an error is returned only when nothing could.
func ReadLive(ctx context.Context) (*Live, error) {
	l := &Live{NFT: nftrace.New(), NFTText: map[v1.IPFamily]string{}}
	addrs, ifAddrs, err := nodeAddrs()
	if err != nil {
		return nil, fmt.Errorf("reading the node's addresses: %w", err)
	}
	l.Addrs, l.IfAddrs = addrs, ifAddrs
	sets, err := readIPSets(ctx)
	if err != nil {
		l.Problems = append(l.Problems, err.Error())
	}
	vss, err := readIPVS(ctx)
	if err != nil {
		l.Problems = append(l.Problems, err.Error())
	}
	l.IPSets, l.IPVS = sets, vss
	if acct, err := nfacct.New(0); err == nil { // it only reads
		acct.Close()
		l.NFAcct = iptables.NFAcct{InvalidDropped: true, LocalhostNodePorts: true}
	}
	for _, backend := range xtables.Backends {
		for _, family := range families {
			x, err := readXTables(ctx, backend, family, sets, vss)
			if err != nil {
				l.Problems = append(l.Problems, err.Error())
				continue
			}
			if x != nil {
				l.XTables = append(l.XTables, x)
			}
		}
	}
	if len(l.XTables) == 0 && !xtables.Available(xtables.BackendNFT, v1.IPv4Protocol) && !xtables.Available(xtables.BackendLegacy, v1.IPv4Protocol) {
		l.Problems = append(l.Problems, "no iptables tools found (iptables-nft-save, iptables-legacy-save): iptables rules not read")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		l.Problems = append(l.Problems, "no nft command found: nftables tables not read")
	}
	l.OtherNFTTables = otherNFTTables(ctx)
	for _, family := range families {
		text, err := listNFTTable(ctx, family)
		if err != nil {
			l.Problems = append(l.Problems, err.Error())
			continue
		}
		if text == "" {
			continue
		}
		if err := l.NFT.Load(text); err != nil {
			l.Problems = append(l.Problems, fmt.Sprintf("loading the %s nftables table into the tracer: %v", family, err))
			continue
		}
		l.NFTText[family] = text
		l.NFTFamilies = append(l.NFTFamilies, family)
	}
	return l, nil
}

// Modes names the modes whose rules the node holds: "iptables (nft backend)", "nftables", ...
func (l *Live) Modes() []string {
	var out []string
	for _, x := range l.XTables {
		if x.Empty() {
			continue
		}
		m := fmt.Sprintf("iptables (%s backend)", x.Backend)
		if mode := x.mode(); mode != config.ModeIPTables {
			m = fmt.Sprintf("%s (iptables %s backend)", mode, x.Backend)
			if mode == config.ModeUserspace && x.Chains > x.userspaceChains() {
				m += fmt.Sprintf(", iptables (%s backend)", x.Backend)
			}
		}
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	if len(l.NFTFamilies) > 0 {
		out = append(out, "nftables")
	}
	return out
}

// XTablesFor returns the non-empty iptables state of a family, backends in the order read (nft first).
func (l *Live) XTablesFor(family v1.IPFamily) []*XTables {
	var out []*XTables
	for _, x := range l.XTables {
		if x.Family == family && !x.Empty() {
			out = append(out, x)
		}
	}
	return out
}

// mode names the mode whose rules these are: mode ipvs' or userspace's when the mode's own chains are
// there, mode iptables' otherwise.
func (x *XTables) mode() config.ProxyMode {
	switch {
	case x.userspace():
		return config.ModeUserspace
	case x.ipvs():
		return config.ModeIPVS
	}
	return config.ModeIPTables
}

// ipvs reports whether these are mode ipvs' iptables rules (its chains, not mode iptables').
func (x *XTables) ipvs() bool {
	for _, table := range tracedTables {
		if slices.ContainsFunc(x.Tables.Chains(table), func(c string) bool { return ipvs.OwnsChain(table, c) }) {
			return true
		}
	}
	return false
}

// userspace reports whether mode userspace's capture chains are present.
func (x *XTables) userspace() bool { return x.userspaceChains() > 0 }

func (x *XTables) userspaceChains() int {
	n := 0
	for _, table := range tracedTables {
		for _, c := range x.Tables.Chains(table) {
			if userspace.OwnsChain(c) {
				n++
			}
		}
	}
	return n
}

// readXTables reads one backend and family; nil when its tools are missing or it holds no table to read.
func readXTables(ctx context.Context, backend xtables.Backend, family v1.IPFamily, sets []ipSet, vss []ipvsService) (*XTables, error) {
	if !xtables.Available(backend, family) {
		return nil, nil
	}
	runner, err := xtables.NewRunner(backend, family)
	if err != nil {
		return nil, err
	}
	saves := map[string]string{}
	for _, table := range tracedTables {
		// Reading a legacy table that does not exist would create it: look first.
		if backend == xtables.BackendLegacy && !xtables.HasTable(backend, family, table) {
			continue
		}
		var buf bytes.Buffer
		if err := runner.Save(ctx, table, &buf); err != nil {
			if xtables.IsNotExist(err) {
				continue
			}
			return nil, fmt.Errorf("reading the %s %s %s table: %w", backend, family, table, err)
		}
		saves[table] = buf.String()
	}
	if len(saves) == 0 {
		return nil, nil
	}
	return loadXTables(backend, family, saves, sets, tracerServers(vss))
}

// listNFTTable returns `nft list table FAMILY kube-proxy`, "" when there is no such table or no nft.
func listNFTTable(ctx context.Context, family v1.IPFamily) (string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return "", nil
	}
	nftFamily := "ip"
	if family == v1.IPv6Protocol {
		nftFamily = "ip6"
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "nft", "list", "table", nftFamily, nftables.TableName)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := stderr.String()
		var ee *exec.ExitError
		if errors.As(err, &ee) && (strings.Contains(msg, "No such file or directory") || strings.Contains(msg, "does not exist")) {
			return "", nil
		}
		return "", fmt.Errorf("nft list table %s %s: %v: %s", nftFamily, nftables.TableName, err, strings.TrimSpace(msg))
	}
	return stdout.String(), nil
}

// otherNFTTables lists `nft list tables` but for kube-proxy's and the tables iptables-nft keeps (nat,
// filter, mangle, raw, security of families ip and ip6).
func otherNFTTables(ctx context.Context) []string {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil
	}
	out, err := exec.CommandContext(ctx, "nft", "list", "tables").Output()
	if err != nil {
		return nil
	}
	xt := map[string]bool{"nat": true, "filter": true, "mangle": true, "raw": true, "security": true}
	var tables []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "table" {
			continue
		}
		if f[2] == nftables.TableName && (f[1] == "ip" || f[1] == "ip6") || xt[f[2]] && (f[1] == "ip" || f[1] == "ip6") {
			continue
		}
		tables = append(tables, f[1]+" "+f[2])
	}
	return tables
}

// nodeAddrs lists the addresses of every interface, sorted, and each interface's in the kernel's order.
func nodeAddrs() ([]netip.Addr, map[string][]netip.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, nil, err
	}
	var out []netip.Addr
	byIf := map[string][]netip.Addr{}
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			byIf[i.Name] = append(byIf[i.Name], ip)
			if !slices.Contains(out, ip) {
				out = append(out, ip)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, byIf, nil
}

// addrsBut returns the node's addresses but those of one interface (kube-ipvs0: the Service addresses
// mode ipvs binds there are not the node's own).
func (l *Live) addrsBut(iface string) []netip.Addr {
	var out []netip.Addr
	for _, a := range l.Addrs {
		if !slices.Contains(l.IfAddrs[iface], a) {
			out = append(out, a)
		}
	}
	return out
}

// localAddrsFor returns the node's addresses with those of the interface in first (the address a
// REDIRECT of an arriving packet goes to is the incoming interface's primary one).
func (l *Live) localAddrsFor(in string) []netip.Addr {
	out := slices.Clone(l.IfAddrs[in])
	for _, a := range l.Addrs {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// recentDir holds the kernel's "-m recent" lists (mode iptables' session affinity), one file per list.
var recentDir = "/proc/net/xt_recent"

// recentLists names the "-m recent" lists that hold src: the Services' endpoints this client has session
// affinity with. The lists' timeouts are the rules' (--seconds); an entry past them no longer matches,
// which this does not check.
func recentLists(src netip.Addr) []string {
	entries, err := os.ReadDir(recentDir)
	if err != nil {
		return nil
	}
	want := "src=" + src.String() + " "
	var out []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(recentDir, e.Name()))
		if err == nil && strings.Contains(string(b), want) {
			out = append(out, e.Name())
		}
	}
	return out
}
