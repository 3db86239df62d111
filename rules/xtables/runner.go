package xtables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/coreos/go-iptables/iptables"
	v1 "k8s.io/api/core/v1"
)

// WaitSeconds is how long iptables-restore waits for the xtables lock before failing (upstream waits 5 s).
const WaitSeconds = "5"

// Runner runs the iptables tools of one backend and family.
type Runner struct {
	Backend Backend
	Family  v1.IPFamily
	ipt     *iptables.IPTables
	restore string
	save    string
}

// NewRunner returns a Runner, failing when the backend's tools for family are missing or do not run.
func NewRunner(b Backend, family v1.IPFamily) (*Runner, error) {
	proto := iptables.ProtocolIPv4
	if family == v1.IPv6Protocol {
		proto = iptables.ProtocolIPv6
	}
	ipt, err := iptables.New(iptables.IPFamily(proto), iptables.Path(Command(b, family, "")), iptables.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Command(b, family, ""), err)
	}
	return &Runner{Backend: b, Family: family, ipt: ipt,
		restore: Command(b, family, "restore"), save: Command(b, family, "save")}, nil
}

// UsableRunner returns a Runner for backend and family after checking that its tools are installed and
// can read the kernel (ip6tables fails where IPv6 is disabled, or without the ip6 nat table).
func UsableRunner(b Backend, family v1.IPFamily) (*Runner, error) {
	if !Available(b, family) {
		return nil, fmt.Errorf("%s tools for %s are not installed", b, family)
	}
	r, err := NewRunner(b, family)
	if err != nil {
		return nil, err
	}
	// One built-in chain, not a save of the table: that would print every rule of a big node.
	if ok, err := r.ChainExists("nat", "POSTROUTING"); err != nil || !ok {
		return nil, fmt.Errorf("%s %s does not work here: the nat table is not usable (%v)", b, family, err)
	}
	return r, nil
}

// Restore feeds payload to iptables-restore --noflush, waiting for the xtables lock. The tables in the
// payload are each committed atomically: on failure the kernel keeps what it had.
func (r *Runner) Restore(ctx context.Context, payload []byte) error {
	cmd := exec.CommandContext(ctx, r.restore, "--noflush", "-w", WaitSeconds)
	cmd.Stdin = bytes.NewReader(payload)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return &RestoreError{Err: err, Stderr: strings.TrimSpace(stderr.String()), Line: failedLine(stderr.String(), payload)}
	}
	return nil
}

// RestoreError is a failed iptables-restore, with the payload line it complained about when it named one.
type RestoreError struct {
	Err    error
	Stderr string
	Line   string
}

func (e *RestoreError) Error() string {
	s := fmt.Sprintf("iptables-restore: %v: %s", e.Err, e.Stderr)
	if e.Line != "" {
		s += fmt.Sprintf(" (line: %q)", e.Line)
	}
	return s
}

func (e *RestoreError) Unwrap() error { return e.Err }

// failedLine finds the payload line named by "line N failed" in iptables-restore's error output.
func failedLine(stderr string, payload []byte) string {
	i := strings.Index(stderr, "line ")
	if i < 0 {
		return ""
	}
	var n int
	if _, err := fmt.Sscanf(stderr[i:], "line %d", &n); err != nil || n <= 0 {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(payload))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for l := 1; sc.Scan(); l++ {
		if l == n {
			return sc.Text()
		}
	}
	return ""
}

// Save writes iptables-save output for table into buf (reset first).
func (r *Runner) Save(ctx context.Context, table string, buf *bytes.Buffer) error {
	buf.Reset()
	cmd := exec.CommandContext(ctx, r.save, "-t", table)
	cmd.Stdout = buf
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s -t %s: %w: %s", r.save, table, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// ListChains returns the names of the chains of a table: over netlink for iptables-nft, from
// iptables-save for iptables-legacy (whose save is fast).
func (r *Runner) ListChains(ctx context.Context, table string) ([]string, error) {
	if r.Backend == BackendNFT {
		return nftChains(r.Family, table)
	}
	var buf bytes.Buffer
	if err := r.Save(ctx, table, &buf); err != nil {
		return nil, err
	}
	return Chains(buf.Bytes()), nil
}

// Chains returns the names of the chains iptables-save declares in its output for one table.
func Chains(save []byte) []string {
	var out []string
	for len(save) > 0 {
		line := save
		if i := bytes.IndexByte(save, '\n'); i >= 0 {
			line, save = save[:i], save[i+1:]
		} else {
			save = nil
		}
		if len(line) > 1 && line[0] == ':' {
			if j := bytes.IndexByte(line, ' '); j > 1 {
				out = append(out, string(line[1:j]))
			}
		}
	}
	return out
}

// EnsureChain creates chain in table unless it exists.
func (r *Runner) EnsureChain(table, chain string) error {
	exists, err := r.ipt.ChainExists(table, chain)
	if err != nil {
		return fmt.Errorf("checking chain %s/%s: %w", table, chain, err)
	}
	if exists {
		return nil
	}
	if err := r.ipt.NewChain(table, chain); err != nil {
		return fmt.Errorf("creating chain %s/%s: %w", table, chain, err)
	}
	return nil
}

// ChainExists reports whether chain exists in table.
func (r *Runner) ChainExists(table, chain string) (bool, error) {
	return r.ipt.ChainExists(table, chain)
}

// EnsureRule makes sure a rule exists in a chain: inserted first when prepend is set, appended otherwise.
// It reports whether it had to add it.
func (r *Runner) EnsureRule(prepend bool, table, chain string, rule ...string) (bool, error) {
	exists, err := r.ipt.Exists(table, chain, rule...)
	if err != nil {
		return false, fmt.Errorf("checking rule in %s/%s: %w", table, chain, err)
	}
	if exists {
		return false, nil
	}
	if prepend {
		err = r.ipt.Insert(table, chain, 1, rule...)
	} else {
		err = r.ipt.Append(table, chain, rule...)
	}
	if err != nil {
		return false, fmt.Errorf("adding rule to %s/%s: %w", table, chain, err)
	}
	return true, nil
}

// RuleExists reports whether a rule exists in a chain.
func (r *Runner) RuleExists(table, chain string, rule ...string) (bool, error) {
	return r.ipt.Exists(table, chain, rule...)
}

// DeleteRule deletes a rule if it exists.
func (r *Runner) DeleteRule(table, chain string, rule ...string) error {
	return r.ipt.DeleteIfExists(table, chain, rule...)
}

// IsNotExist reports whether err says that a chain, rule or table does not exist.
func IsNotExist(err error) bool {
	var e *iptables.Error
	return errors.As(err, &e) && e.IsNotExist()
}

// Backends lists the iptables backends in the order every loop over them takes: nft first.
var Backends = []Backend{BackendNFT, BackendLegacy}

// RunnersWithNAT returns a usable Runner for every backend and IP family (nft first, IPv4 first) whose nat
// table exists, the tables every mode writing iptables rules has. A legacy nat table that does not exist
// is not probed, since probing would create it. skipped (nil: ignored) hears why a backend and family
// were left out.
func RunnersWithNAT(skipped func(b Backend, family v1.IPFamily, why string)) []*Runner {
	var out []*Runner
	for _, b := range Backends {
		for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			if !HasTable(b, family, "nat") {
				if skipped != nil {
					skipped(b, family, "no nat table")
				}
				continue
			}
			r, err := UsableRunner(b, family)
			if err != nil {
				if skipped != nil {
					skipped(b, family, err.Error())
				}
				continue
			}
			out = append(out, r)
		}
	}
	return out
}
