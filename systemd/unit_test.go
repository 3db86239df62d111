package systemd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// directives returns the unit's settings as key → values, in order (comments dropped, continuations joined).
func directives(t *testing.T) map[string][]string {
	t.Helper()
	unit, err := os.ReadFile("kube-proxy.service")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	text := strings.ReplaceAll(string(unit), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = append(out[k], strings.Join(strings.Fields(v), " "))
		}
	}
	return out
}

// TestUnitHardening keeps the sandbox and the holes the daemon needs in it together (the lab's
// TestHardening runs the daemon under it and measures it): the capabilities, a read-only system with
// /proc/sys/net and the conntrack hash size writable for the sysctls, the xtables lock created before
// /run turns read-only, no module loading, and a system call filter that fails calls rather than kills.
func TestUnitHardening(t *testing.T) {
	d := directives(t)
	for key, want := range map[string]string{
		"CapabilityBoundingSet": "CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE CAP_SYS_RESOURCE",
		"ProtectSystem":         "strict",
		"ReadOnlyPaths":         "/run",
		"ReadWritePaths":        "/proc/sys/net -/sys/module/nf_conntrack/parameters",
		"ExecStartPre":          "-+/usr/bin/touch /run/xtables.lock",
		"PrivateDevices":        "yes",
		"ProtectKernelTunables": "yes",
		"ProtectKernelModules":  "yes",
		"ProtectProc":           "invisible",
		"UMask":                 "0077",
		"SystemCallErrorNumber": "EPERM",
	} {
		if got := strings.Join(d[key], " | "); got != want {
			t.Errorf("%s=%q, want %q", key, got, want)
		}
	}
	if got, want := d["SystemCallFilter"], []string{"@system-service", "~@privileged @resources"}; strings.Join(got, " | ") != strings.Join(want, " | ") {
		t.Errorf("SystemCallFilter= lines %q, want %q", got, want)
	}
}

// TestUnitFileDescriptorStore: the store that hands mode userspace's listeners to the next process is on,
// and what it may hold, passed to the next process at its start, leaves most of LimitNOFILE to the
// daemon's connections.
func TestUnitFileDescriptorStore(t *testing.T) {
	d := directives(t)
	get := func(key string) int {
		t.Helper()
		v := d[key]
		if len(v) != 1 {
			t.Fatalf("%s= set %d times, want once", key, len(v))
		}
		n, err := strconv.Atoi(v[0])
		if err != nil {
			t.Fatalf("%s=%s: %v", key, v[0], err)
		}
		return n
	}
	store, files := get("FileDescriptorStoreMax"), get("LimitNOFILE")
	if store <= 0 {
		t.Fatalf("FileDescriptorStoreMax=%d: mode userspace's listeners would not survive a restart", store)
	}
	if store > files/2 {
		t.Errorf("FileDescriptorStoreMax=%d is more than half of LimitNOFILE=%d", store, files)
	}
	// FileDescriptorStorePreserve= exists from systemd 254 only; 252 warns about it, and the default
	// (keep the store across restarts) is what the daemon needs on both.
	if _, ok := d["FileDescriptorStorePreserve"]; ok {
		t.Error("FileDescriptorStorePreserve= is unknown to systemd 252")
	}
}
