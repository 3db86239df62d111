package systemd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnitVerifies runs systemd-analyze verify on the shipped unit. verify exits 0 even for unknown keys
// and bad values, so any output at all is a failure. The binary path is pointed at an existing executable
// because verify also checks that ExecStart= and ExecReload= can run.
func TestUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("KP_E2E") != "" {
			t.Fatal("systemd-analyze not found (install systemd)")
		}
		t.Skip("systemd-analyze not installed")
	}
	unit, err := os.ReadFile("kube-proxy.service")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart=/usr/local/bin/kube-proxy") {
		t.Fatal("unit does not start /usr/local/bin/kube-proxy")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "kube-proxy.service")
	body := strings.ReplaceAll(string(unit), "/usr/local/bin/kube-proxy", "/bin/true")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: err=%v output:\n%s", err, out)
	}
}

// TestUnitHasSeedSettings keeps the settings users of the seed unit rely on.
func TestUnitHasSeedSettings(t *testing.T) {
	unit, err := os.ReadFile("kube-proxy.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"--config=/var/lib/kube-proxy/kube-proxy-config.yaml",
		"--v=2",
		"Restart=on-failure",
		"RestartSec=5",
		"LimitNOFILE=65536",
		"Type=notify",
		"ExecReload=/usr/local/bin/kube-proxy reload $MAINPID",
		"WatchdogSec=",
		"NoNewPrivileges=yes",
		"CapabilityBoundingSet=",
	} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("unit lacks %q", want)
		}
	}
}
