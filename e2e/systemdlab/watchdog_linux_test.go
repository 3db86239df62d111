package systemdlab

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// hangFile is where the faults build looks for its switch: /run, since the unit's PrivateTmp hides /tmp.
const hangFile = "/run/kube-proxy-hang-sync"

// watchdogDropIn shortens the watchdog and the restart delay, and turns on the faults build's switch.
const watchdogDropIn = `[Service]
WatchdogSec=3
RestartSec=1
Environment=KP_FAULT_HANG_SYNC=` + hangFile + `
`

// TestWatchdog installs the faultinject build with the unit, a drop-in with a 3 s watchdog, and a 1 s sync
// period (so the sync loop counts as unhealthy after 2 s without progress). A healthy daemon outlives
// several watchdog periods; once its sync loop hangs it stops pinging, systemd kills it (Result=watchdog)
// and restarts it, and the new process becomes ready when the hang is gone.
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

			// Hang the sync loop: no more pings, systemd kills and restarts it.
			l.must("touch " + hangFile)
			waited := l.waitFor("a watchdog restart", 30*time.Second, func() bool {
				n, _ := strconv.Atoi(l.prop("NRestarts"))
				return n >= 1
			})
			ms = append(ms, measurement{suite.Name, "sync hang -> watchdog restart", waited})
			l.must("rm " + hangFile)
			j := l.journal()
			for _, want := range []string{"FAULT INJECTION", "Sync loop unhealthy; withholding watchdog pings"} {
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
