package main

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

// nftTable is the table both implementations write in mode nftables, and nftServiceIPs its verdict map
// from destination address, protocol and port to a Service's chain.
const (
	nftTable      = "kube-proxy"
	nftServiceIPs = "service-ips"
)

// nftListing is what the benchmark reads from `nft list table ip kube-proxy`: where the service-ips map
// sends each destination, and the endpoints each chain's DNAT rules translate to.
type nftListing struct {
	// Dispatch maps "ip:port" (TCP) to the chain service-ips sends it to.
	Dispatch map[string]string
	// Endpoints maps a chain to the endpoints ("ip:port", sorted) its DNAT rules translate to.
	Endpoints map[string][]string
	// Chains and Lines count the chains and the lines of the listing.
	Chains, Lines int
}

// parseNFTListing reads a listing of one table. It understands the shapes both implementations write
// for a Service without session affinity: `meta l4proto tcp dnat to IP:PORT` and `meta l4proto tcp dnat
// ip to numgen random mod N map { 0 : IP . PORT, ... }`, and the service-ips elements `IP . tcp . PORT :
// goto CHAIN`.
func parseNFTListing(text string) (*nftListing, error) {
	l := &nftListing{Dispatch: map[string]string{}, Endpoints: map[string][]string{}}
	lines := strings.Split(text, "\n")
	l.Lines = len(lines)
	var kind, name string // the block being read
	for i := 0; i < len(lines); i++ {
		stmt := strings.TrimSpace(lines[i])
		// A statement whose braces do not close on its line goes on over the next lines.
		for strings.Count(stmt, "{") > strings.Count(stmt, "}") && !opensBlock(stmt) && i+1 < len(lines) {
			i++
			stmt += " " + strings.TrimSpace(lines[i])
		}
		switch {
		case stmt == "" || strings.HasPrefix(stmt, "table "):
		case opensBlock(stmt):
			f := strings.Fields(stmt)
			kind, name = f[0], f[len(f)-2]
			if kind == "chain" {
				l.Chains++
			}
		case stmt == "}":
			kind, name = "", ""
		case kind == "map" && name == nftServiceIPs && strings.HasPrefix(stmt, "elements = {"):
			for _, e := range splitElements(stmt[len("elements = "):]) {
				key, verdict, ok := strings.Cut(e, " : ")
				key, _, _ = strings.Cut(key, " comment ")
				f := strings.Split(key, " . ")
				chain, isGoto := strings.CutPrefix(verdict, "goto ")
				if !ok || len(f) != 3 || !isGoto {
					return nil, fmt.Errorf("service-ips element %q: not ADDR . PROTO . PORT : goto CHAIN", e)
				}
				if f[1] != "tcp" {
					continue
				}
				addr, err := netip.ParseAddr(f[0])
				if err != nil {
					return nil, fmt.Errorf("service-ips element %q: %w", e, err)
				}
				l.Dispatch[addr.String()+":"+f[2]] = chain
			}
		case kind == "chain" && dnatStatement.MatchString(stmt):
			eps, err := dnatTargets(stmt)
			if err != nil {
				return nil, fmt.Errorf("chain %s: %w", name, err)
			}
			l.Endpoints[name] = append(l.Endpoints[name], eps...)
			slices.Sort(l.Endpoints[name])
		}
	}
	return l, nil
}

// opensBlock reports whether a trimmed listing line starts a table or an object of one (chain, set,
// map, counter, ...): a keyword, a name and an opening brace (a table: its family too).
func opensBlock(stmt string) bool {
	f := strings.Fields(stmt)
	return (len(f) == 3 && f[1] != "=" || len(f) == 4 && f[0] == "table") && f[len(f)-1] == "{"
}

// splitElements returns the comma-separated items between the outer braces of s.
func splitElements(s string) []string {
	i, j := strings.IndexByte(s, '{'), strings.LastIndexByte(s, '}')
	if i < 0 || j < i {
		return nil
	}
	var out []string
	for _, e := range strings.Split(s[i+1:j], ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// dnatStatement matches a rule's DNAT statement (not `ct status dnat`, a match).
var dnatStatement = regexp.MustCompile(`(^| )dnat (ip (addr \. port )?)?to `)

// dnatTargets returns the endpoints ("ip:port") of a DNAT rule.
func dnatTargets(rule string) ([]string, error) {
	loc := dnatStatement.FindStringIndex(rule)
	after := rule[loc[1]-len("to "):]
	if strings.Contains(after, " map {") {
		var out []string
		for _, e := range splitElements(after) {
			_, target, ok := strings.Cut(e, " : ")
			ip, port, ok2 := strings.Cut(target, " . ")
			if !ok || !ok2 {
				return nil, fmt.Errorf("DNAT map element %q: not N : ADDR . PORT", e)
			}
			out = append(out, ip+":"+port)
		}
		return out, nil
	}
	f := strings.Fields(after)
	for k := 0; k+1 < len(f); k++ {
		if f[k] == "to" {
			if _, err := netip.ParseAddrPort(f[k+1]); err != nil {
				return nil, fmt.Errorf("DNAT target in %q: %w", rule, err)
			}
			return []string{f[k+1]}, nil
		}
	}
	return nil, fmt.Errorf("no DNAT target in %q", rule)
}

// nftChangeText is the nft transaction upstream's writer produces for a change of one Service's
// endpoints without session affinity: the chain (re)declared and flushed, then its one DNAT rule with
// the endpoints (sorted "ip:port"), a numgen map for several.
func nftChangeText(chain string, eps []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "add chain ip %s %s\nflush chain ip %s %s\n", nftTable, chain, nftTable, chain)
	fmt.Fprintf(&b, "add rule ip %s %s meta l4proto tcp dnat ", nftTable, chain)
	if len(eps) == 1 {
		b.WriteString("to " + eps[0] + "\n")
		return b.String()
	}
	fmt.Fprintf(&b, "ip addr . port to numgen random mod %d map { ", len(eps))
	for i, ep := range eps {
		ap := netip.MustParseAddrPort(ep)
		if i > 0 {
			b.WriteString(" , ")
		}
		fmt.Fprintf(&b, "%d : %s . %d", i, ap.Addr(), ap.Port())
	}
	b.WriteString(" }\n")
	return b.String()
}
