//go:build !linux

package netnstest

import (
	"os"
	"testing"
)

// Backends are the iptables variants tested.
var Backends = []string{"nft", "legacy"}

// NS is a network namespace created for one test.
type NS struct{ Name string }

// Enabled reports whether kernel tests should run; never on this platform.
func Enabled() bool { return false }

// New skips the test: network namespaces are Linux-only.
func New(t testing.TB) *NS {
	t.Helper()
	t.Skip("kernel tests need Linux")
	return nil
}

// Check does nothing on this platform.
func Check(t testing.TB, backend string, ipv6 bool) {}

// Restore is not available on this platform.
func (ns *NS) Restore(backend string, ipv6 bool, payload []byte, args ...string) error { return nil }

// Save is not available on this platform.
func (ns *NS) Save(backend string, ipv6 bool, table string) (string, error) { return "", nil }

// Exec is not available on this platform.
func (ns *NS) Exec(stdin []byte, name string, args ...string) (string, error) { return "", nil }

// File is not available on this platform.
func (ns *NS) File(t testing.TB) *os.File { return nil }

// Do is not available on this platform.
func (ns *NS) Do(fn func() error) error { return nil }
