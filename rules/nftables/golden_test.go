package nftables

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestGolden compares the table a rebuild writes (as the Fake holds it: chains and sets by name, rules in
// order, elements sorted) with testdata/<name>.golden; -update rewrites the files. The kernel tests show
// the same transactions load into a real kernel and read back as nft would write them.
func TestGolden(t *testing.T) {
	bridge := func(c *Config) {
		c.LocalDetector = proxy.LocalDetector{Mode: config.LocalModeBridgeInterface, Interface: "cbr0"}
	}
	for _, tc := range []struct {
		name   string
		family v1.IPFamily
		cidr   string
		edit   func(c *Config)
	}{
		{"ipv4", v4, "10.244.0.0/16", func(*Config) {}},
		{"ipv6", v6, "fd00:10:244::/48", func(*Config) {}},
		{"ipv4-primary-bridge", v4, "", func(c *Config) { c.NodePortAddresses.Primary = true; bridge(c) }},
		{"ipv4-masquerade-all-bit0-localhost-reject", v4, "10.244.0.0/16", func(c *Config) {
			c.MasqueradeAll, c.MasqueradeBit, c.LocalhostReject = true, 0, true
		}},
		// nodePortAddresses with loopback: TCP loopback NodePorts are left to the userspace proxy, the
		// others still rejected.
		{"ipv4-localhost-proxy", v4, "10.244.0.0/16", func(c *Config) { c.LocalhostReject, c.LocalhostProxy = true, true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.family, tc.cidr)
			tc.edit(&cfg)
			got := rebuilt(t, cfg, richSnapshot(tc.family), "10.0.0.1", "fd00::1")
			path := filepath.Join("testdata", tc.name+".golden")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("%s (-golden +got):\n%s", path, diff)
			}
		})
	}
}
