package systemdlab

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// hangFile and failFile are where the faults build looks for its switches (hang the sync loop; fail every
// apply): /run, since the unit's PrivateTmp hides /tmp.
const (
	hangFile = "/run/kube-proxy-hang-sync"
	failFile = "/run/kube-proxy-fail-apply"
)

// watchdogDropIn shortens the watchdog and the restart delay, and turns on the faults build's switch.
const watchdogDropIn = `[Service]
WatchdogSec=3
RestartSec=1
Environment=KP_FAULT_HANG_SYNC=` + hangFile + `
Environment=KP_FAULT_FAIL_APPLY=` + failFile + `
`

// TestWatchdog installs the faultinject build with the unit, a drop-in with a 3 s watchdog, and a 1 s sync
// period (so a sync running for 2 s counts as stuck, and a change waiting 2 s as unhealthy). A healthy
// daemon outlives several watchdog periods. So does one whose every sync fails (the kernel refusing the
// rules): no restart loop, /healthz stays 200 while no change waits, turns 503 when one does, and the
// STATUS line says why. Once its sync loop hangs it stops pinging, systemd kills it (Result=watchdog) and
// restarts it, and the new process becomes ready when the hang is gone.
func TestWatchdog(t *testing.T) {
	c := requireLab(t)
	blocks := guideBlocks(t)
	var ms []measurement
	for _, suite := range Suites {
		t.Run(suite.Name, func(t *testing.T) {
			ensureRootfs(t, suite)
			createService(t, c)
			l := newLab(t, c, suite)
			l.copyIn(artifacts.faults, "kube-proxy-faults", 0o755)
			l.must(blocks["install"])
			l.must("install -m 0755 kube-proxy-faults /usr/local/bin/kube-proxy")
			l.must(blocks["config"])
			base := l.must("cat " + configPath)
			l.writeConfig(base + "iptables:\n  syncPeriod: 1s\n")
			l.must("mkdir -p /etc/systemd/system/kube-proxy.service.d && cat >/etc/systemd/system/kube-proxy.service.d/watchdog.conf <<'EOF'\n" + watchdogDropIn + "EOF")
			l.verifyUnit("kube-proxy.service")
			l.must("systemctl daemon-reload && systemctl enable --now kube-proxy")
			first := l.wantProps("after start", map[string]string{"ActiveState": "active", "SubState": "running", "WatchdogUSec": "3s"})

			// Healthy: pings keep it alive through more than two watchdog periods.
			time.Sleep(7 * time.Second)
			l.wantProps("7 s later, healthy", map[string]string{"ActiveState": "active", "NRestarts": "0", "MainPID": first["MainPID"]})

			// Every apply fails: the loop still turns, so no restart; healthy while nothing waits.
			l.must("touch " + failFile)
			time.Sleep(7 * time.Second)
			l.wantProps("7 s of failing syncs", map[string]string{"ActiveState": "active", "NRestarts": "0", "MainPID": first["MainPID"]})
			if status := l.prop("StatusText"); !strings.Contains(status, "sync failing") || !strings.Contains(status, "FAULT INJECTION") {
				t.Errorf("STATUS while syncs fail (refreshed every 5 s): %q, want the failures and their cause", status)
			}
			if code, body, err := l.get(10256, "/healthz"); err != nil || code != http.StatusOK {
				t.Errorf("/healthz while syncs fail with nothing queued: %d %v %s, want 200 (upstream's rule)", code, err, body)
			}
			createService(t, c) // a change that cannot reach the kernel
			l.waitFor("/healthz to fail once a change waits longer than 2 × syncPeriod", 15*time.Second, func() bool {
				code, _, err := l.get(10256, "/healthz")
				return err == nil && code == http.StatusServiceUnavailable
			})
			l.wantProps("with a change waiting", map[string]string{"ActiveState": "active", "NRestarts": "0", "MainPID": first["MainPID"]})
			l.must("rm " + failFile)
			waited := l.waitFor("/healthz to answer 200 once the kernel takes the rules", 15*time.Second, func() bool {
				code, _, err := l.get(10256, "/healthz")
				return err == nil && code == http.StatusOK
			})
			ms = append(ms, measurement{suite.Name, "apply failures end -> /healthz 200", waited})
			l.waitFor("the STATUS line to drop the failures", 15*time.Second, func() bool {
				return !strings.Contains(l.prop("StatusText"), "sync failing")
			})

			// Hang the sync loop: no more pings, systemd kills and restarts it.
			l.must("touch " + hangFile)
			waited = l.waitFor("a watchdog restart", 30*time.Second, func() bool {
				n, _ := strconv.Atoi(l.prop("NRestarts"))
				return n >= 1
			})
			ms = append(ms, measurement{suite.Name, "sync hang -> watchdog restart", waited})
			l.must("rm " + hangFile)
			j := l.journal()
			for _, want := range []string{"FAULT INJECTION", "Sync loop stuck; withholding watchdog pings"} {
				if !strings.Contains(j, want) {
					t.Errorf("the daemon's journal lacks %q", want)
				}
			}
			if sys := l.must("journalctl -u kube-proxy --no-pager -o cat _PID=1"); !strings.Contains(sys, "Watchdog timeout") {
				t.Errorf("systemd did not log a watchdog timeout:\n%s", sys)
			}
			l.waitFor("the restarted daemon to become ready", 30*time.Second, func() bool {
				p := l.props("ActiveState", "SubState", "MainPID")
				return p["ActiveState"] == "active" && p["SubState"] == "running" && p["MainPID"] != first["MainPID"] && p["MainPID"] != "0"
			})
			l.wantProps("after the restart", map[string]string{"NRestarts": "1"})
		})
	}
	logMeasurements(t, ms)
}
