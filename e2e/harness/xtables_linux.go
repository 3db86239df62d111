package harness

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/xtables"
)

// The iptables backends, as the tools name them (iptables-nft, iptables-legacy).
const (
	BackendNFT    = "nft"
	BackendLegacy = "legacy"
)

// XTables runs the iptables tools of one backend inside a namespace. Every command gets
// XTABLES_LOCKFILE=LockFile, so the legacy backend's lock is a file of the test's own and the host's
// /run/xtables.lock is never taken (iptables 1.8.9 honours the variable; the nft backend takes no lock).
type XTables struct {
	NS *NetNS
	// Backend is BackendNFT or BackendLegacy.
	Backend string
	// LockFile is the xtables lock file handed to the tools (and meant for the daemons under test).
	LockFile string
}

// NewXTables returns the tools of backend in ns with a lock file in dir (created empty).
func NewXTables(ns *NetNS, backend, dir string) (*XTables, error) {
	if backend != BackendNFT && backend != BackendLegacy {
		return nil, fmt.Errorf("iptables backend %q: want %q or %q", backend, BackendNFT, BackendLegacy)
	}
	lock := filepath.Join(dir, "xtables.lock")
	f, err := os.OpenFile(lock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating xtables lock file: %w", err)
	}
	_ = f.Close()
	return &XTables{NS: ns, Backend: backend, LockFile: lock}, nil
}

// Env returns the environment entry pointing the iptables tools at LockFile.
func (x *XTables) Env() string { return "XTABLES_LOCKFILE=" + x.LockFile }

// Tool returns the name of a tool of the backend: Tool(false, "") is "iptables-nft", Tool(true,
// "save") is "ip6tables-nft-save".
func (x *XTables) Tool(ipv6 bool, tool string) string {
	return IPTablesTool(x.Backend, ipv6, tool)
}

// IPTablesTool returns the name of an iptables tool of backend: IPTablesTool("legacy", true,
// "restore") is "ip6tables-legacy-restore"; an empty tool names iptables itself.
func IPTablesTool(backend string, ipv6 bool, tool string) string {
	family := v1.IPv4Protocol
	if ipv6 {
		family = v1.IPv6Protocol
	}
	return xtables.Command(xtables.Backend(backend), family, tool)
}

// Run runs tool (see Tool) with args inside the namespace and returns its combined output.
func (x *XTables) Run(ctx context.Context, ipv6 bool, tool string, args ...string) (string, error) {
	return x.NS.RunEnv(ctx, []string{x.Env()}, append([]string{x.Tool(ipv6, tool)}, args...)...)
}

// IPTables runs `iptables-<backend> args...` (IPv4).
func (x *XTables) IPTables(ctx context.Context, args ...string) (string, error) {
	return x.Run(ctx, false, "", args...)
}

// Save returns iptables-save output for one table ("" for all tables).
func (x *XTables) Save(ctx context.Context, ipv6 bool, table string) (string, error) {
	var args []string
	if table != "" {
		args = []string{"-t", table}
	}
	return x.Run(ctx, ipv6, "save", args...)
}

// SetHint creates the KUBE-IPTABLES-HINT chain in the mangle table of the backend, as kubelet does, so
// that kube-proxy (ours, or upstream's iptables wrapper) picks this backend.
func (x *XTables) SetHint(ctx context.Context) error {
	_, err := x.IPTables(ctx, "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
	return err
}

// RunEnv is Run with extra environment entries ("KEY=value") for the command.
func (n *NetNS) RunEnv(ctx context.Context, env []string, args ...string) (string, error) {
	if len(args) == 0 {
		return "", fmt.Errorf("netns run: no command")
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in %s: %s: %w: %s", n.Name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// SavedTable is one table of iptables-save output, parsed.
type SavedTable struct {
	// Chains maps each declared chain to its policy ("-" for user chains).
	Chains map[string]string
	// Rules are the "-A ..." lines in order.
	Rules []string
}

// ParseSave parses iptables-save output into its tables, dropping comments and counters.
func ParseSave(out string) map[string]*SavedTable {
	tables := map[string]*SavedTable{}
	var cur *SavedTable
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "*"):
			cur = &SavedTable{Chains: map[string]string{}}
			tables[line[1:]] = cur
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if len(f) >= 2 {
				cur.Chains[f[0]] = f[1]
			}
		case strings.HasPrefix(line, "-A "):
			cur.Rules = append(cur.Rules, line)
		}
	}
	return tables
}

// ChainNames returns the table's chains whose names start with prefix, sorted.
func (s *SavedTable) ChainNames(prefix string) []string {
	var out []string
	for c := range s.Chains {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	sort.Strings(out)
	return out
}

// RulesOf returns the rules of one chain, in order.
func (s *SavedTable) RulesOf(chain string) []string {
	var out []string
	for _, r := range s.Rules {
		if strings.HasPrefix(r, "-A "+chain+" ") {
			out = append(out, r)
		}
	}
	return out
}

// KubeChains lists the chains named KUBE-* of every table of both families in the backend, sorted, as
// "IPv4/nat/KUBE-SERVICES" or "IPv6/filter/KUBE-FORWARD"; it fails t when iptables-save does.
func (x *XTables) KubeChains(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, ipv6 := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := x.Save(ctx, ipv6, "")
		cancel()
		if err != nil {
			t.Fatalf("iptables-save (%s): %v", x.Backend, err)
		}
		fam := "IPv4"
		if ipv6 {
			fam = "IPv6"
		}
		for table, tab := range ParseSave(s) {
			for _, c := range tab.ChainNames("KUBE-") {
				out = append(out, fam+"/"+table+"/"+c)
			}
		}
	}
	sort.Strings(out)
	return out
}
