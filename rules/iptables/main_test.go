package iptables

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"kube-proxy/rules/sysctl"
)

// TestMain points the sysctl package at a scratch tree, so that no test of this package reads or writes
// the machine's /proc/sys (the tests run as root, in the root network namespace): route_localnet and
// nf_conntrack_tcp_be_liberal start at 0 there.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "iptables-sysctl-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sysctl.Root = dir
	for _, name := range []string{sysctlRouteLocalnet, sysctlTCPBeLiberal} {
		setFakeSysctl(dir, name, "0")
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func setFakeSysctl(root, name, value string) {
	p := filepath.Join(root, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		panic(err)
	}
	if err := os.WriteFile(p, []byte(value+"\n"), 0o644); err != nil {
		panic(err)
	}
}

func fakeSysctl(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sysctl.Root, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
