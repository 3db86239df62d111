package sysctl

import (
	"os"
	"path/filepath"
	"testing"
)

func TestTree(t *testing.T) {
	tree := At(t.TempDir())
	p := tree.path("net/ipv4/conf/all/route_localnet")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, err := tree.Get("net/ipv4/conf/all/route_localnet"); err != nil || v != 0 {
		t.Fatalf("Get = %d, %v", v, err)
	}
	if wrote, err := tree.Set("net.ipv4.conf.all.route_localnet", 1); err != nil || !wrote {
		t.Fatalf("Set = %v, %v; want a write", wrote, err)
	}
	if v, err := tree.Get("net/ipv4/conf/all/route_localnet"); err != nil || v != 1 {
		t.Fatalf("after Set: %d, %v", v, err)
	}
	if wrote, err := tree.Set("net/ipv4/conf/all/route_localnet", 1); err != nil || wrote {
		t.Fatalf("Set of the same value = %v, %v; want no write", wrote, err)
	}
	if _, err := tree.Get("net/missing"); err == nil {
		t.Fatal("Get of a missing parameter succeeded")
	}
	if _, err := tree.Set("net/missing", 1); err == nil {
		t.Fatal("Set of a missing parameter succeeded") // /proc/sys does not create parameters
	}
}

func TestPackageFunctionsUseRoot(t *testing.T) {
	Root = t.TempDir()
	defer func() { Root = "/proc/sys" }()
	if err := os.WriteFile(filepath.Join(Root, "p"), []byte("3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Set("p", 4); err != nil {
		t.Fatal(err)
	}
	if v, err := Get("p"); err != nil || v != 4 {
		t.Fatalf("Get = %d, %v", v, err)
	}
}
