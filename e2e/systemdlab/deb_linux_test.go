package systemdlab

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// debs are three builds of the package around the binary under test: 0.1.1 differs from 0.1.0 only in its
// version; 0.1.2 also ships a changed config file. Paths on the host.
type debs struct{ v010, v011, v012 string }

func buildDebs(t *testing.T) debs {
	t.Helper()
	buildArtifacts(t)
	root := repoRoot(t)
	out := t.TempDir()
	example, err := os.ReadFile(filepath.Join(root, "kube-proxy-config.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	changed := filepath.Join(t.TempDir(), "changed.yaml")
	if err := os.WriteFile(changed, append(example, "# a line added by release 0.1.2\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	build := func(version, config string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(root, "packaging/deb.sh"), artifacts.binary, runtime.GOARCH, version, out)
		cmd.Env = append(os.Environ(), "KP_DEB_COMPRESSION=gzip")
		if config != "" {
			cmd.Env = append(cmd.Env, "KP_DEB_CONFIG="+config)
		}
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("packaging/deb.sh %s: %v", version, err)
		}
		return strings.TrimSpace(string(b))
	}
	return debs{build("v0.1.0", ""), build("v0.1.1", ""), build("v0.1.2", changed)}
}

// TestDeb installs the .deb with apt in a fresh machine, follows the package's instructions, upgrades it
// twice (the second time with a packaged config that changed too), then removes and purges it, checking at
// each step the files, the unit's state and the admin's edited config.
func TestDeb(t *testing.T) {
	c := requireLab(t)
	d := buildDebs(t)
	var ms []measurement
	for _, suite := range Suites {
		t.Run(suite.Name, func(t *testing.T) {
			ensureRootfs(t, suite)
			svc := createService(t, c)
			l := newLab(t, c, suite)
			for _, p := range []string{d.v010, d.v011, d.v012} {
				l.copyIn(p, filepath.Base(p), 0o644)
			}
			deb := func(p string) string { return "./" + filepath.Base(p) }
			const unitPath = "/usr/lib/systemd/system/kube-proxy.service"
			exists := func(path string) bool { return l.run("test -e "+path).Code == 0 }

			// Install: files in place, nothing started or enabled, the next steps printed.
			r := l.run("apt-get install -y " + deb(d.v010))
			ms = append(ms, measurement{suite.Name, "apt-get install (fresh)", r.Took})
			if r.Code != 0 {
				t.Fatalf("apt-get install: exit %d:\n%s", r.Code, r.Out)
			}
			if !strings.Contains(r.Out, "systemctl enable --now kube-proxy") {
				t.Errorf("the install does not say what to do next:\n%s", r.Out)
			}
			for _, p := range []string{"/usr/bin/kube-proxy", unitPath, configPath} {
				if !exists(p) {
					t.Errorf("%s not installed", p)
				}
			}
			l.wantProps("after install", map[string]string{"LoadState": "loaded", "ActiveState": "inactive", "UnitFileState": "disabled"})
			l.verifyUnit("kube-proxy.service")
			// Upstream's line first, as scripts that parse it expect, then this build's.
			if out := l.must("kube-proxy --version"); !strings.HasPrefix(out, "Kubernetes v1.37") || !strings.Contains(out, "\nkube-proxy ") {
				t.Errorf("kube-proxy --version: %q, want \"Kubernetes v1.37...\" then \"kube-proxy ...\"", out)
			}

			// The admin's part: a kubeconfig, an edited config, enable --now.
			l.must("install -m 0600 kube-proxy.kubeconfig /var/lib/kube-proxy/kubeconfig")
			l.must(`sed -i 's|^clusterCIDR: ""|clusterCIDR: 10.200.0.0/16|' ` + configPath)
			edited := l.must("grep -c '^clusterCIDR: 10.200.0.0/16$' " + configPath + " && sha256sum " + configPath)
			r = l.run("systemctl enable --now kube-proxy")
			ms = append(ms, measurement{suite.Name, "systemctl enable --now (.deb)", r.Took})
			if r.Code != 0 {
				t.Fatalf("systemctl enable --now: exit %d:\n%s", r.Code, r.Out)
			}
			before := l.wantProps("after enable --now", map[string]string{"ActiveState": "active", "SubState": "running", "UnitFileState": "enabled"})
			if nat := l.natRules(); !strings.Contains(nat, svc.Comment()) {
				t.Errorf("no rules for %s after enable --now", svc.Comment())
			}

			// Upgrade, same packaged config: config untouched, service restarted, still enabled.
			r = l.run("apt-get install -y " + deb(d.v011))
			ms = append(ms, measurement{suite.Name, "apt-get install (upgrade, restart)", r.Took})
			if r.Code != 0 {
				t.Fatalf("upgrade to 0.1.1: exit %d:\n%s", r.Code, r.Out)
			}
			l.upgraded(t, "0.1.1", edited, before["MainPID"])
			before = l.props("MainPID")

			// Upgrade with a changed packaged config, non-interactively as the guide says: ours is kept, the
			// package's is set aside.
			r = l.run("apt-get -o Dpkg::Options::=--force-confold install -y " + deb(d.v012))
			if r.Code != 0 {
				t.Fatalf("upgrade to 0.1.2: exit %d:\n%s", r.Code, r.Out)
			}
			l.upgraded(t, "0.1.2", edited, before["MainPID"])
			if out := l.run("tail -n 1 " + configPath + ".dpkg-dist").Out; !strings.Contains(out, "added by release 0.1.2") {
				t.Errorf("the new packaged config was not saved as .dpkg-dist: %q", out)
			}

			// Remove: stopped, disabled, binary and unit gone, config kept, rules left in place.
			r = l.run("apt-get remove -y kube-proxy")
			if r.Code != 0 {
				t.Fatalf("apt-get remove: exit %d:\n%s", r.Code, r.Out)
			}
			l.wantProps("after remove", map[string]string{"LoadState": "not-found", "ActiveState": "inactive"})
			for _, p := range []string{"/usr/bin/kube-proxy", unitPath, "/etc/systemd/system/multi-user.target.wants/kube-proxy.service"} {
				if exists(p) {
					t.Errorf("%s left after remove", p)
				}
			}
			if !exists(configPath) {
				t.Errorf("remove deleted the config")
			}
			if nat := l.natRules(); !strings.Contains(nat, svc.Comment()) {
				t.Errorf("remove deleted the rules for %s (only --cleanup should)", svc.Comment())
			}

			// Purge: nothing of the package left.
			r = l.run("apt-get purge -y kube-proxy")
			if r.Code != 0 {
				t.Fatalf("apt-get purge: exit %d:\n%s", r.Code, r.Out)
			}
			if out := l.run("dpkg-query -W -f='${db:Status-Abbrev}' kube-proxy").Out; strings.HasPrefix(out, "ii") || strings.HasPrefix(out, "rc") {
				t.Errorf("after purge, dpkg still knows the package: %q", out)
			}
			if left := l.must("find /etc /usr /var /run -name '*kube-proxy*' ! -path '/var/log/journal/*' 2>/dev/null || true"); strings.TrimSpace(left) != "" {
				t.Errorf("left after purge:\n%s", left)
			}
			if out := l.must("systemctl list-units --all --no-legend 'kube-proxy*'"); strings.TrimSpace(out) != "" {
				t.Errorf("systemd still lists units after purge:\n%s", out)
			}
		})
	}
	logMeasurements(t, ms)
}

// upgraded checks the state after an upgrade to version: the admin's config unchanged (edited is its
// earlier checksum output), no dpkg leftovers beside it other than .dpkg-dist, the service restarted (a
// PID other than oldPID), running and still enabled.
func (l *lab) upgraded(t *testing.T, version, edited, oldPID string) {
	t.Helper()
	if got := l.must("dpkg-query -W -f='${Version}' kube-proxy"); got != version {
		t.Errorf("installed version %q, want %s", got, version)
	}
	if got := l.must("grep -c '^clusterCIDR: 10.200.0.0/16$' " + configPath + " && sha256sum " + configPath); got != edited {
		t.Errorf("upgrade to %s changed the edited config:\n%s\nwant\n%s", version, got, edited)
	}
	if out := l.must("ls -A /var/lib/kube-proxy"); strings.Contains(out, ".dpkg-new") || strings.Contains(out, ".dpkg-old") {
		t.Errorf("upgrade to %s left dpkg files: %s", version, out)
	}
	got := l.wantProps("after the upgrade to "+version, map[string]string{"ActiveState": "active", "SubState": "running", "UnitFileState": "enabled"})
	if got["MainPID"] == oldPID {
		t.Errorf("the upgrade to %s did not restart the service (PID %s)", version, oldPID)
	}
}
