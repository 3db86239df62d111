package systemdlab

import (
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"kube-proxy/e2e/harness"
)

// upstreamUnit is upstream kube-proxy's unit from "Kubernetes the hard way": a simple service (upstream does
// not speak sd_notify) with the same name, binary path and config file as ours.
const upstreamUnit = `[Unit]
Description=Kubernetes Kube Proxy (upstream)

[Service]
ExecStart=/usr/local/bin/kube-proxy --config=/var/lib/kube-proxy/kube-proxy-config.yaml
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target
`

// lastSync matches upstream's metric once its first sync is done (with or without an ip_family label).
var lastSync = regexp.MustCompile(`(?m)^kubeproxy_sync_proxy_rules_last_timestamp_seconds(\{[^}]*\})? [1-9]`)

// serviceChains returns the sorted KUBE-SVC/KUBE-SEP chains whose rules carry comment, and the rules that
// carry it: what must be the same whichever kube-proxy wrote the table.
func serviceChains(nat, comment string) (chains, rules []string) {
	seen := map[string]bool{}
	chain := regexp.MustCompile(`KUBE-(SVC|SEP)-[A-Z0-9]{16}`)
	for _, line := range strings.Split(nat, "\n") {
		if !strings.HasPrefix(line, "-A ") || !strings.Contains(line, comment) {
			continue
		}
		rules = append(rules, line)
		for _, c := range chain.FindAllString(line, -1) {
			seen[c] = true
		}
	}
	for c := range seen {
		chains = append(chains, c)
	}
	sort.Strings(chains)
	sort.Strings(rules)
	return chains, rules
}

// TestSwitchUpstream runs upstream kube-proxy (v1.37.2, built by e2e/tools/build-cluster.sh) under its
// hard-way unit, then follows the guide to switch to ours and back: each takes over the other's rules on
// its first sync, with the same chains and no duplicates, and the rules stay in place across every stop.
func TestSwitchUpstream(t *testing.T) {
	c := requireLab(t)
	blocks := guideBlocks(t)
	bin, err := harness.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	var ms []measurement
	for _, suite := range Suites {
		t.Run(suite.Name, func(t *testing.T) {
			ensureRootfs(t, suite)
			svc := createService(t, c)
			l := newLab(t, c, suite)
			l.copyIn(filepath.Join(bin, "kube-proxy"), "kube-proxy-upstream", 0o755)
			l.writeLabFile("upstream.service", upstreamUnit)

			// Upstream kube-proxy, installed the hard way with the guide's config. The lab leaves the global
			// conntrack limit alone: it is read-only inside a network namespace, and upstream fails on it.
			l.must("install -m 0755 kube-proxy-upstream /usr/local/bin/kube-proxy && " +
				"install -m 0644 upstream.service /etc/systemd/system/kube-proxy.service")
			l.must(blocks["config"])
			l.writeConfig(l.must("cat "+configPath) + "conntrack:\n  maxPerCore: 0\n")
			l.must("systemctl daemon-reload && systemctl enable --now kube-proxy")
			if v := l.must("kube-proxy --version"); !strings.Contains(v, "Kubernetes v1.37") {
				t.Fatalf("not upstream kube-proxy: %q", v)
			}
			upstreamSynced := func() bool {
				code, body, err := l.get(10249, "/metrics")
				return err == nil && code == http.StatusOK &&
					lastSync.MatchString(body)
			}
			l.waitFor("upstream's first sync", 30*time.Second, upstreamSynced)
			wantChains, wantRules := serviceChains(l.natRules(), svc.Comment())
			if len(wantChains) < 2 {
				t.Fatalf("upstream wrote no KUBE-SVC/KUBE-SEP chains for %s:\n%s", svc.Comment(), l.natRules())
			}
			sameRules := func(who string) {
				t.Helper()
				chains, rules := serviceChains(l.natRules(), svc.Comment())
				if !slices.Equal(chains, wantChains) || !slices.Equal(rules, wantRules) {
					t.Errorf("after %s: chains %v with these rules for %s:\n%s\nwant upstream's %v with\n%s", who, chains,
						svc.Comment(), strings.Join(rules, "\n"), wantChains, strings.Join(wantRules, "\n"))
				}
			}

			// The guide's switch, verbatim: it returns once ours has synced.
			r := l.run(blocks["switch"])
			ms = append(ms, measurement{suite.Name, "switch block (stop upstream, start ours)", r.Took})
			if r.Code != 0 {
				t.Fatalf("switch block: exit %d:\n%s", r.Code, r.Out)
			}
			l.wantProps("after switching to ours", map[string]string{"ActiveState": "active", "SubState": "running", "Type": "notify"})
			if s := l.prop("StatusText"); !strings.HasPrefix(s, "Proxying ") {
				t.Errorf("after switching, StatusText = %q", s)
			}
			sameRules("switching to ours")
			l.noLegacyTables("after switching to ours")

			// And back.
			r = l.run(blocks["switch-back"])
			ms = append(ms, measurement{suite.Name, "switch-back block", r.Took})
			if r.Code != 0 {
				t.Fatalf("switch-back block: exit %d:\n%s", r.Code, r.Out)
			}
			l.wantProps("after switching back", map[string]string{"ActiveState": "active", "Type": "simple"})
			if v := l.must("kube-proxy --version"); !strings.Contains(v, "Kubernetes v1.37") {
				t.Errorf("after switching back, kube-proxy --version = %q", v)
			}
			l.waitFor("upstream's first sync after switching back", 30*time.Second, upstreamSynced)
			sameRules("switching back to upstream")
			l.must("systemctl stop kube-proxy")
			sameRules("stopping upstream")
		})
	}
	logMeasurements(t, ms)
}
