package systemdlab

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

const configPath = "/var/lib/kube-proxy/kube-proxy-config.yaml"

// writeConfig replaces the config file inside the machine, as an admin's editor would.
func (l *lab) writeConfig(body string) {
	l.t.Helper()
	l.must(fmt.Sprintf("cat >%s <<'EOF'\n%sEOF", configPath, body))
}

// TestHardWay follows docs/INSTALL.md on a fresh machine, as a new user would, and then checks what the
// guide promises: enable --now returns once the daemon is ready (rules written), status shows our line,
// reload applies a live field and waits until it is in force, an invalid edit or a restart-only change is
// refused by reload while the daemon keeps running, restart and stop behave (stop within 2 s, rules left),
// and the guide's uninstall removes the rules and every file.
func TestHardWay(t *testing.T) {
	c := requireLab(t)
	blocks := guideBlocks(t)
	var ms []measurement
	for _, suite := range Suites {
		t.Run(suite.Name, func(t *testing.T) {
			ensureRootfs(t, suite)
			svc := createService(t, c)
			l := newLab(t, c, suite)
			took := func(what string, r Result) { ms = append(ms, measurement{suite.Name, what, r.Took}) }

			// Steps 2-4 of the guide, verbatim.
			if out := l.must(blocks["install"]); !strings.Contains(out, "kube-proxy ") {
				t.Errorf("install block: no version printed:\n%s", out)
			}
			l.verifyUnit("/etc/systemd/system/kube-proxy.service")
			// The check bites: this systemd prints something for a misspelt key.
			l.writeLabFile("typo.service", "[Service]\nExecStart=/bin/true\nRestartSecs=1\n")
			if out := l.run("systemd-analyze verify /lab/typo.service").Out; !strings.Contains(out, "RestartSecs") {
				t.Errorf("systemd-analyze verify said nothing about a misspelt key: %q", out)
			}
			if out := l.must(blocks["config"]); !strings.Contains(out, "config OK") {
				t.Errorf("config block: the check did not pass:\n%s", out)
			}
			base := l.must("cat " + configPath)
			l.must("systemctl daemon-reload")
			r := l.run("systemctl enable --now kube-proxy")
			took("systemctl enable --now", r)
			if r.Code != 0 {
				t.Fatalf("systemctl enable --now: exit %d:\n%s", r.Code, r.Out)
			}
			// No waiting from here on: a Type=notify start returns after READY=1, which the daemon sends
			// only after its first sync wrote the rules.
			l.wantProps("right after enable --now", map[string]string{
				"ActiveState": "active", "SubState": "running", "UnitFileState": "enabled"})
			if nat := l.natRules(); !strings.Contains(nat, svc.Comment()) {
				t.Errorf("right after enable --now, the nat table has no rules for %s:\n%s", svc.Comment(), nat)
			}
			if code, body, err := l.get(10256, "/healthz"); err != nil || code != http.StatusOK {
				t.Errorf("right after enable --now, /healthz: %d %v %s", code, err, body)
			}
			l.noLegacyTables("right after enable --now")
			status := l.prop("StatusText")
			if !strings.HasPrefix(status, "Proxying ") || !strings.Contains(status, "node lab") {
				t.Errorf("StatusText = %q, want our status line", status)
			}
			if out := l.run("systemctl status kube-proxy --no-pager").Out; !strings.Contains(out, `Status: "`+status+`"`) {
				t.Errorf("systemctl status does not show the status line:\n%s", out)
			}
			pid := l.prop("MainPID")

			// A live field: the reload returns once it is in force.
			if got := field(l.configz(10249), "iptables.syncPeriod"); got != "30s" {
				t.Fatalf("iptables.syncPeriod before the reload = %v, want the default 30s", got)
			}
			live := base + "iptables:\n  syncPeriod: 17s\n"
			l.writeConfig(live)
			r = l.run("systemctl reload kube-proxy")
			took("systemctl reload (applied)", r)
			if r.Code != 0 {
				t.Fatalf("systemctl reload: exit %d:\n%s", r.Code, r.Out)
			}
			if got := field(l.configz(10249), "iptables.syncPeriod"); got != "17s" {
				t.Errorf("right after systemctl reload returned, iptables.syncPeriod = %v, want 17s", got)
			}
			l.wantProps("after a reload", map[string]string{"ActiveState": "active", "SubState": "running", "MainPID": pid,
				"ReloadResult": "success"})

			// The unit's --v=2 wins over logging.verbosity, as the guide says.
			l.writeConfig(live + "logging:\n  verbosity: 5\n")
			if r := l.run("systemctl reload kube-proxy"); r.Code != 0 {
				t.Errorf("reload with logging.verbosity: exit %d:\n%s", r.Code, r.Out)
			}
			if got := field(l.configz(10249), "logging.verbosity"); got != float64(2) {
				t.Errorf("logging.verbosity in force = %v, want 2 (the unit's --v=2 overrides the file)", got)
			}

			// An invalid edit: reload fails, the daemon keeps running with what it had.
			l.writeConfig(base + "iptables:\n  syncPeriod: banana\n")
			r = l.run("systemctl reload kube-proxy")
			took("systemctl reload (invalid)", r)
			if r.Code == 0 {
				t.Errorf("systemctl reload of an invalid config succeeded:\n%s", r.Out)
			}
			l.wantProps("after an invalid reload", map[string]string{"ActiveState": "active", "SubState": "running", "MainPID": pid,
				"ReloadResult": "exit-code"})
			if got := field(l.configz(10249), "iptables.syncPeriod"); got != "17s" {
				t.Errorf("after an invalid reload, iptables.syncPeriod = %v, want 17s still", got)
			}
			if s := l.prop("StatusText"); !strings.Contains(s, "last reload invalid") {
				t.Errorf("after an invalid reload, StatusText = %q", s)
			}
			if j := l.journal(); !strings.Contains(j, "Configuration reload refused") || !strings.Contains(j, "banana") {
				t.Errorf("the journal does not say why the reload was refused:\n%s", j)
			}

			// A restart-only field: reload refuses it, restart applies it.
			l.writeConfig(live + "metricsBindAddress: 127.0.0.1:10259\n")
			r = l.run("systemctl reload kube-proxy")
			if r.Code == 0 {
				t.Errorf("systemctl reload of a restart-only change succeeded:\n%s", r.Out)
			}
			if s := l.prop("StatusText"); !strings.Contains(s, "restart-required") || !strings.Contains(s, "metricsBindAddress") {
				t.Errorf("after a restart-only change, StatusText = %q", s)
			}
			r = l.run("systemctl restart kube-proxy")
			took("systemctl restart", r)
			if r.Code != 0 {
				t.Fatalf("systemctl restart: exit %d:\n%s", r.Code, r.Out)
			}
			got := l.wantProps("right after restart", map[string]string{"ActiveState": "active", "SubState": "running"})
			if got["MainPID"] == pid {
				t.Errorf("restart kept PID %s", pid)
			}
			if got := field(l.configz(10259), "metricsBindAddress"); got != "127.0.0.1:10259" {
				t.Errorf("after restart, metricsBindAddress = %v", got)
			}

			// Stop: quick, clean, rules left in place.
			r = l.run("systemctl stop kube-proxy")
			took("systemctl stop", r)
			if r.Code != 0 || r.Took > 2*time.Second {
				t.Errorf("systemctl stop: exit %d after %v (want 0 within 2 s):\n%s", r.Code, r.Took, r.Out)
			}
			l.wantProps("after stop", map[string]string{"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"})
			if nat := l.natRules(); !strings.Contains(nat, svc.Comment()) {
				t.Errorf("stop removed the rules for %s:\n%s", svc.Comment(), nat)
			}
			if j := l.journal(); !strings.Contains(j, "the rules stay in place") {
				t.Errorf("the journal does not show the clean stop:\n%s", j)
			}

			// The guide's uninstall: the rules go with --cleanup, the files and the unit with the rest.
			l.must(blocks["uninstall"])
			l.noLegacyTables("after the guide's uninstall")
			if nat := l.natRules(); strings.Contains(nat, "KUBE-") {
				t.Errorf("KUBE- chains left after the guide's uninstall:\n%s", nat)
			}
			l.wantProps("after uninstall", map[string]string{"LoadState": "not-found", "ActiveState": "inactive"})
			if left := l.must("ls -d /usr/local/bin/kube-proxy /var/lib/kube-proxy /etc/systemd/system/kube-proxy.service* " +
				"/etc/systemd/system/*.wants/kube-proxy.service 2>/dev/null || true"); strings.TrimSpace(left) != "" {
				t.Errorf("left after the guide's uninstall:\n%s", left)
			}
		})
	}
	logMeasurements(t, ms)
}
