package xtables

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Backend is the iptables flavour: "nft" (iptables-nft, nf_tables underneath) or "legacy" (x_tables).
type Backend string

// The two backends.
const (
	BackendNFT    Backend = "nft"
	BackendLegacy Backend = "legacy"
)

// Hint chains other node components create in the mangle table of the backend they use (kubelet's and
// upstream kube-proxy's), as upstream's iptables wrapper looks for them.
var hintChains = []string{"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"}

// Command returns the name of an iptables tool for a backend and family: tool "restore", "save" or ""
// (iptables itself), e.g. ip6tables-legacy-restore. The tests' namespaces and the e2e harness name the
// tools with it too.
func Command(b Backend, family v1.IPFamily, tool string) string {
	name := "iptables"
	if family == v1.IPv6Protocol {
		name = "ip6tables"
	}
	name += "-" + string(b)
	if tool != "" {
		name += "-" + tool
	}
	return name
}

// Available reports whether the tools of a backend and family are installed.
func Available(b Backend, family v1.IPFamily) bool {
	for _, tool := range []string{"", "save", "restore"} {
		if _, err := exec.LookPath(Command(b, family, tool)); err != nil {
			return false
		}
	}
	return true
}

// Detect picks the backend this node's rules live in, the way upstream's iptables wrapper does: the backend
// holding a hint chain from kubelet or kube-proxy wins; otherwise the one holding more rules; otherwise the
// system's default `iptables`. The reason is returned for the log.
func Detect(ctx context.Context) (Backend, string, error) {
	var candidates []Backend
	for _, b := range Backends {
		if Available(b, v1.IPv4Protocol) {
			candidates = append(candidates, b)
		}
	}
	switch len(candidates) {
	case 0:
		return "", "", fmt.Errorf("neither iptables-nft nor iptables-legacy is installed (install the iptables package)")
	case 1:
		return candidates[0], "only backend installed", nil
	}
	save := func(b Backend, args ...string) (string, error) {
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, Command(b, v1.IPv4Protocol, "save"), args...)
		cmd.Stdout = &out
		err := cmd.Run()
		return out.String(), err
	}
	// The hints live in mangle, a small table: look there first, so that a node with many Services is not
	// saved whole at every start. A legacy mangle table that does not exist holds no hint, and saving it
	// would create it.
	for _, b := range candidates {
		if !HasTable(b, v1.IPv4Protocol, "mangle") {
			continue
		}
		s, err := save(b, "-t", "mangle")
		if err != nil {
			continue // e.g. legacy tables not available in this kernel
		}
		for _, h := range hintChains {
			if strings.Contains(s, ":"+h+" ") {
				return b, "found " + h, nil
			}
		}
	}
	rules := map[Backend]int{}
	for _, b := range candidates {
		// Without -t, iptables-legacy-save prints only the tables that exist.
		if s, err := save(b); err == nil {
			rules[b] = strings.Count(s, "\n-A ")
		}
	}
	if rules[BackendNFT] != rules[BackendLegacy] {
		if rules[BackendLegacy] > rules[BackendNFT] {
			return BackendLegacy, fmt.Sprintf("more rules in legacy (%d vs %d)", rules[BackendLegacy], rules[BackendNFT]), nil
		}
		return BackendNFT, fmt.Sprintf("more rules in nft (%d vs %d)", rules[BackendNFT], rules[BackendLegacy]), nil
	}
	out, err := exec.CommandContext(ctx, "iptables", "-V").Output()
	if err == nil && strings.Contains(string(out), "legacy") {
		return BackendLegacy, "system default iptables", nil
	}
	return BackendNFT, "system default iptables", nil
}

// HasTable reports whether backend b has table ("nat", "filter", ...; "" for any) for family in this
// network namespace, so that there can be rules in it. For iptables-nft it is always true: its tools never
// create a table by reading it. For iptables-legacy it reads /proc/net/ip_tables_names (ip6_tables_names):
// the legacy tools create every table they read or delete from, and once one exists every iptables-nft
// command on the node warns "iptables-legacy tables present". Code that looks at a backend the node may
// not use asks here first.
func HasTable(b Backend, family v1.IPFamily, table string) bool {
	if b != BackendLegacy {
		return true
	}
	names := legacyTables(family)
	if table == "" {
		return len(names) > 0
	}
	return slices.Contains(names, table)
}

// legacyTables lists the x_tables tables of family that exist in this network namespace (none when the
// ip_tables module is not loaded).
func legacyTables(family v1.IPFamily) []string {
	file := "/proc/net/ip_tables_names"
	if family == v1.IPv6Protocol {
		file = "/proc/net/ip6_tables_names"
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}
