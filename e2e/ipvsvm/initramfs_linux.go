package ipvsvm

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// cpioWriter writes an uncompressed newc archive, the initramfs format the kernel unpacks (uncompressed
// boots faster under software emulation than gzip).
type cpioWriter struct {
	w    *bufio.Writer
	ino  int
	seen map[string]bool
	err  error
}

func newCPIO(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20), ino: 1, seen: map[string]bool{}}
}

func (c *cpioWriter) header(name string, mode uint32, size int) {
	if c.err != nil {
		return
	}
	c.ino++
	_, c.err = fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	if c.err == nil {
		_, c.err = c.w.WriteString(name + "\x00")
	}
	c.pad(110 + len(name) + 1)
}

func (c *cpioWriter) pad(n int) {
	if c.err != nil {
		return
	}
	if r := n % 4; r != 0 {
		_, c.err = c.w.Write(make([]byte, 4-r))
	}
}

// dir adds a directory and its missing parents.
func (c *cpioWriter) dir(name string) {
	name = strings.Trim(name, "/")
	if name == "" || name == "." || c.seen[name] {
		return
	}
	c.dir(path.Dir(name))
	c.seen[name] = true
	c.header(name, 0o040755, 0)
}

// file adds a regular file with its data.
func (c *cpioWriter) file(name string, mode os.FileMode, data []byte) {
	name = strings.Trim(name, "/")
	if c.seen[name] {
		return
	}
	c.dir(path.Dir(name))
	c.seen[name] = true
	c.header(name, 0o100000|uint32(mode.Perm()), len(data))
	if c.err == nil {
		_, c.err = c.w.Write(data)
	}
	c.pad(len(data))
}

// hostFile adds a file of the host (symlinks resolved) under name.
func (c *cpioWriter) hostFile(name, src string) {
	if c.err != nil {
		return
	}
	st, err := os.Stat(src)
	if err != nil {
		c.err = err
		return
	}
	b, err := os.ReadFile(src)
	if err != nil {
		c.err = err
		return
	}
	c.file(name, st.Mode(), b)
}

func (c *cpioWriter) symlink(name, target string) {
	name = strings.Trim(name, "/")
	if c.seen[name] {
		return
	}
	c.dir(path.Dir(name))
	c.seen[name] = true
	c.header(name, 0o120777, len(target))
	if c.err == nil {
		_, c.err = c.w.WriteString(target)
	}
	c.pad(len(target))
}

// tree adds a host directory tree under prefix.
func (c *cpioWriter) tree(prefix, src string) {
	if c.err != nil {
		return
	}
	c.err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		name := path.Join(prefix, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			c.dir(name)
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			c.symlink(name, t)
		default:
			c.hostFile(name, p)
		}
		return c.err
	})
}

func (c *cpioWriter) close() error {
	c.header("TRAILER!!!", 0, 0)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}

// hostBinaries are the host's user-space tools the guest needs, with the names it calls them by.
var hostBinaries = []struct {
	cmd   string   // looked up in PATH
	dst   string   // path in the guest
	links []string // more names for it in the guest
	need  bool
}{
	{"ip", "/sbin/ip", nil, true},
	{"ipvsadm", "/sbin/ipvsadm", nil, true},
	{"ipset", "/sbin/ipset", nil, true},
	{"kmod", "/sbin/modprobe", []string{"/sbin/depmod", "/sbin/lsmod"}, true},
	{"xtables-nft-multi", "/sbin/xtables-nft-multi", []string{
		"/sbin/iptables", "/sbin/iptables-save", "/sbin/iptables-restore",
		"/sbin/iptables-nft", "/sbin/iptables-nft-save", "/sbin/iptables-nft-restore",
		"/sbin/ip6tables", "/sbin/ip6tables-save", "/sbin/ip6tables-restore",
		"/sbin/ip6tables-nft", "/sbin/ip6tables-nft-save", "/sbin/ip6tables-nft-restore"}, true},
}

// Tools the host needs to build and boot the VM, with the Debian package providing each.
var hostTools = map[string]string{
	"qemu-system-x86_64": "qemu-system-x86", "busybox": "busybox-static", "ip": "iproute2", "ipvsadm": "ipvsadm",
	"ipset": "ipset", "kmod": "kmod", "depmod": "kmod", "xtables-nft-multi": "iptables", "ldd": "libc-bin",
	"apt-get": "apt", "dpkg-deb": "dpkg",
}

// MissingTools lists the host tools that are missing, as "tool (package)".
func MissingTools() []string {
	var out []string
	for tool, pkg := range hostTools {
		if _, err := exec.LookPath(tool); err != nil {
			out = append(out, tool+" ("+pkg+")")
		}
	}
	sort.Strings(out)
	return out
}

// sharedLibs returns the shared libraries a dynamic executable loads (ldd), with the dynamic loader.
func sharedLibs(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	return libs, nil
}

// xtablesLibDir is where iptables looks for its extensions (compiled into libxtables).
const xtablesLibDir = "/usr/lib/x86_64-linux-gnu/xtables"

// bootModules are loaded by /init; the rest load on demand through /sbin/modprobe.
var bootModules = []string{
	"virtio_pci", "virtio_net", "dummy", "veth", "nf_conntrack", "nf_conntrack_netlink",
	"ip_vs", "ip_vs_rr", "ip_set", "xt_set", "nf_tables", "nft_compat", "nft_chain_nat",
}

const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/sbin:/usr/sbin:/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "KPVM NOTE init started at $(cut -d' ' -f1 /proc/uptime)s"
mkdir -p /run/netns /tmp /var
echo /sbin/modprobe > /proc/sys/kernel/modprobe
for m in $(cat /kp/modules); do /sbin/modprobe "$m" || echo "KPVM NOTE modprobe $m failed"; done
echo "KPVM NOTE init done at $(cut -d' ' -f1 /proc/uptime)s"
/kp/agent run
echo "KPVM NOTE agent exited with $? at $(cut -d' ' -f1 /proc/uptime)s"
/bin/busybox poweroff -f
`

// buildInitramfs writes the initramfs: busybox, the host tools with their libraries and the iptables
// extensions, the kernel modules, the agent, the daemon, extra binaries (guest path → host path) with
// their libraries, and files (guest path → content).
func buildInitramfs(dst string, k *Kernel, agent, daemon string, bins map[string]string, files map[string][]byte) error {
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	c := newCPIO(f)
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "run", "tmp", "etc", "root"} {
		c.dir(d)
	}
	c.symlink("var/run", "/run")
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return err
	}
	c.hostFile("bin/busybox", bb)
	libs := map[string]bool{}
	addBin := func(src, dst string) error {
		c.hostFile(dst, src)
		ls, err := sharedLibs(src)
		for _, l := range ls {
			libs[l] = true
		}
		return err
	}
	for _, b := range hostBinaries {
		src, err := exec.LookPath(b.cmd)
		if err != nil {
			if b.need {
				return fmt.Errorf("%s not found on the host", b.cmd)
			}
			continue
		}
		if src, err = filepath.EvalSymlinks(src); err != nil {
			return err
		}
		if err := addBin(src, b.dst); err != nil {
			return err
		}
		for _, l := range b.links {
			c.symlink(l, path.Base(b.dst))
		}
	}
	for dst, src := range bins {
		if err := addBin(src, strings.TrimPrefix(dst, "/")); err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
	}
	exts, _ := filepath.Glob(filepath.Join(xtablesLibDir, "*.so"))
	for _, e := range exts {
		if err := addBin(e, e); err != nil {
			return err
		}
	}
	for l := range libs {
		real, err := filepath.EvalSymlinks(l)
		if err != nil {
			return err
		}
		c.hostFile(l, real)
	}
	for _, e := range []string{"/etc/protocols", "/etc/services", "/etc/ethertypes"} {
		if _, err := os.Stat(e); err == nil {
			c.hostFile(e, e)
		}
	}
	c.file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	c.file("etc/group", 0o644, []byte("root:x:0:\n"))
	c.file("etc/hosts", 0o644, []byte("127.0.0.1 localhost\n::1 localhost\n"))
	c.tree("lib/modules", filepath.Join(k.ModRoot, "lib/modules"))
	c.file("kp/modules", 0o644, []byte(strings.Join(bootModules, "\n")+"\n"))
	c.hostFile(AgentPath, agent)
	if daemon != "" {
		c.hostFile(DaemonPath, daemon)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c.file(n, 0o600, files[n])
	}
	c.file("init", 0o755, []byte(initScript))
	if err := c.close(); err != nil {
		return err
	}
	return f.Close()
}
