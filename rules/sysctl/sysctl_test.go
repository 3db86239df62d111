package sysctl

import (
	"os"
	"path/filepath"
	"testing"
)

func TestGetSet(t *testing.T) {
	Root = t.TempDir()
	defer func() { Root = "/proc/sys" }()
	p := filepath.Join(Root, "net/ipv4/conf/all/route_localnet")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, err := Get("net/ipv4/conf/all/route_localnet"); err != nil || v != 0 {
		t.Fatalf("Get = %d, %v", v, err)
	}
	if err := Set("net.ipv4.conf.all.route_localnet", 1); err != nil {
		t.Fatal(err)
	}
	if v, err := Get("net/ipv4/conf/all/route_localnet"); err != nil || v != 1 {
		t.Fatalf("after Set: %d, %v", v, err)
	}
	if _, err := Get("net/missing"); err == nil {
		t.Fatal("Get of a missing parameter succeeded")
	}
}
