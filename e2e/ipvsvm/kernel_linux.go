package ipvsvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// EnvKernel pins the Debian kernel ABI the VM boots (e.g. "6.1.0-57-amd64"); by default it is the one
// the linux-image-amd64 package of the host's apt sources depends on.
const EnvKernel = "KP_VM_KERNEL"

// CacheDir is where kernels and module trees are cached: ${XDG_CACHE_HOME:-~/.cache}/kube-proxy-e2e/ipvs-vm.
func CacheDir() string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = "/root"
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "kube-proxy-e2e", "ipvs-vm")
}

// Kernel is a cached Debian kernel: its image and a module tree (the subset the VM needs, with depmod's
// indexes) to copy into the initramfs.
type Kernel struct {
	Version string
	Image   string
	// ModRoot holds lib/modules/<Version>/.
	ModRoot string
}

// moduleDirs are the parts of the module tree the VM needs: netfilter (IPVS, ipsets, nf_tables, x_tables,
// conntrack), the bridge's br_netfilter (xt_physdev asks for it), dummy and veth links, virtio networking
// and what they depend on.
var moduleDirs = []string{
	"kernel/net/netfilter", "kernel/net/ipv4/netfilter", "kernel/net/ipv6/netfilter", "kernel/net/bridge",
	"kernel/net/core", "kernel/net/802", "kernel/net/llc", "kernel/drivers/virtio", "kernel/lib", "kernel/crypto",
	"kernel/arch/x86/crypto",
	"kernel/drivers/net/dummy.ko", "kernel/drivers/net/veth.ko", "kernel/drivers/net/virtio_net.ko",
	"kernel/drivers/net/net_failover.ko",
}

// EnsureKernel returns the cached kernel, downloading the Debian package (apt-get download) and preparing
// its module tree on first use.
func EnsureKernel(ctx context.Context, logf func(string, ...any)) (*Kernel, error) {
	version := os.Getenv(EnvKernel)
	if version == "" {
		v, err := resolveKernel(ctx)
		if err != nil {
			return nil, err
		}
		version = v
	}
	dir := filepath.Join(CacheDir(), version)
	k := &Kernel{Version: version, Image: filepath.Join(dir, "vmlinuz"), ModRoot: filepath.Join(dir, "modroot")}
	if _, err := os.Stat(filepath.Join(dir, ".done")); err == nil {
		return k, nil
	}
	start := time.Now()
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	tmp := dir + ".tmp"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	pkg := "linux-image-" + version
	if out, err := command(ctx, tmp, "apt-get", "download", pkg); err != nil {
		return nil, fmt.Errorf("downloading %s: %w: %s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, pkg+"_*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("apt-get download %s left %d packages", pkg, len(debs))
	}
	root := filepath.Join(tmp, "root")
	if out, err := command(ctx, tmp, "dpkg-deb", "-x", debs[0], root); err != nil {
		return nil, fmt.Errorf("unpacking %s: %w: %s", debs[0], err, out)
	}
	stage := filepath.Join(tmp, "stage")
	modSrc := filepath.Join(root, "lib/modules", version)
	modDst := filepath.Join(stage, "modroot/lib/modules", version)
	for _, d := range moduleDirs {
		if _, err := os.Stat(filepath.Join(modSrc, d)); err != nil {
			continue
		}
		if out, err := command(ctx, "", "mkdir", "-p", filepath.Dir(filepath.Join(modDst, d))); err != nil {
			return nil, fmt.Errorf("%w: %s", err, out)
		}
		if out, err := command(ctx, "", "cp", "-a", filepath.Join(modSrc, d), filepath.Join(modDst, d)); err != nil {
			return nil, fmt.Errorf("copying modules: %w: %s", err, out)
		}
	}
	for _, f := range []string{"modules.order", "modules.builtin", "modules.builtin.modinfo"} {
		if b, err := os.ReadFile(filepath.Join(modSrc, f)); err == nil {
			if err := os.WriteFile(filepath.Join(modDst, f), b, 0o644); err != nil {
				return nil, err
			}
		}
	}
	// The package ships no module indexes (its postinst makes them): build them for the subset.
	if out, err := command(ctx, "", "depmod", "-b", filepath.Join(stage, "modroot"), version); err != nil {
		return nil, fmt.Errorf("depmod: %w: %s", err, out)
	}
	if err := copyFile(filepath.Join(root, "boot", "vmlinuz-"+version), filepath.Join(stage, "vmlinuz"), 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(stage, dir); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ".done"), []byte(version+"\n"), 0o644); err != nil {
		return nil, err
	}
	if logf != nil {
		logf("prepared kernel %s in %s (%v)", version, dir, time.Since(start).Round(100*time.Millisecond))
	}
	return k, nil
}

// resolveKernel asks apt which kernel ABI linux-image-amd64 currently depends on, updating the package
// lists once if apt does not know the package.
func resolveKernel(ctx context.Context) (string, error) {
	find := func() string {
		out, _ := exec.CommandContext(ctx, "apt-cache", "depends", "linux-image-amd64").Output()
		for _, l := range strings.Split(string(out), "\n") {
			l = strings.TrimSpace(l)
			if v, ok := strings.CutPrefix(l, "Depends: linux-image-"); ok && v != "" && v[0] >= '0' && v[0] <= '9' {
				return v
			}
		}
		return ""
	}
	if v := find(); v != "" {
		return v, nil
	}
	if out, err := command(ctx, "", "apt-get", "update", "-qq"); err != nil {
		return "", fmt.Errorf("apt-get update: %w: %s", err, out)
	}
	if v := find(); v != "" {
		return v, nil
	}
	// Offline: use a cached kernel if there is one.
	if ents, err := os.ReadDir(CacheDir()); err == nil {
		for _, e := range ents {
			if _, err := os.Stat(filepath.Join(CacheDir(), e.Name(), ".done")); err == nil {
				return e.Name(), nil
			}
		}
	}
	return "", errors.New("cannot tell which kernel linux-image-amd64 depends on (apt-cache depends linux-image-amd64); set " + EnvKernel)
}

func command(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}
