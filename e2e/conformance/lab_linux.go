package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kube-proxy/e2e/harness"
)

// The lab's network. Every address lives in a namespace the lab creates: the host's own links,
// addresses, routes and rules are never touched, and the lab namespace has no way out.
const (
	labNS        = "kpc-lab"    // the control plane, CoreDNS, the test runner, and the bridge
	labBridge    = "kpc0"       // in labNS; every node's eth0 is a port of it
	labIP        = "10.200.0.1" // labBridge's address: the apiserver and CoreDNS listen here
	labPrefix    = "/24"        //
	clusterCIDR  = "10.244.0.0/16"
	serviceCIDR  = "10.96.0.0/16"
	dnsServiceIP = "10.96.0.10"
	apiPort      = 6443
	cgroupPrefix = "kpc-" // every cgroup the lab makes, in every hierarchy
	runRoot      = "/run/kpc"
)

// nodeSpecs are the lab's nodes: each a network namespace with an eth0 on the bridge (its address is
// the node's InternalIP, so every node and the test runner see each other's real addresses), its own
// containerd, kubelet, CNI bridge and pod CIDR. Three, because upstream's test of health-check node
// ports across an externalTrafficPolicy change skips itself on fewer.
var nodeSpecs = []struct{ name, ip, podCIDR string }{
	{"node-a", "10.200.0.2", "10.244.0.0/24"},
	{"node-b", "10.200.0.3", "10.244.1.0/24"},
	{"node-c", "10.200.0.4", "10.244.2.0/24"},
}

// hostSysctls are the host-wide kernel settings the kubelet changes (it sets them as it wants them
// for pods: upstream's protectKernelDefaults=false). The lab saves them before the kubelets start and
// puts them back at teardown.
var hostSysctls = []string{"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory", "vm/panic_on_oom",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// Lab is a three-node Kubernetes cluster on this machine: control plane and nodes in network namespaces
// of their own, every process in a cgroup of the lab's, so teardown finds all of it — also what a
// crashed earlier run left — by name.
type Lab struct {
	// Dir holds certificates, configurations, logs and the data of etcd, containerd and the kubelets.
	Dir  string
	bins binaries
	logf func(string, ...any)

	// kubeProxyVersions maps "ours" and "upstream" to their --version, recorded with each run.
	kubeProxyVersions map[string]string

	ca        *harness.CA
	admin     string // the admin kubeconfig (https://labIP:apiPort)
	images    []string
	nodes     []*node
	processes []*harness.Process
}

// binaries are the programs the lab runs.
type binaries struct {
	cluster     string // kube-apiserver, etcd, upstream kube-proxy (e2e/tools/build-cluster.sh)
	conformance string // kubelet, controller-manager, scheduler, kubectl, e2e.test, ginkgo, agnhost, coredns
	ours        string // our kube-proxy
}

func (b binaries) k8s(name string) string { return filepath.Join(b.conformance, name) }

// node is one of the lab's nodes.
type node struct {
	name, ip, podCIDR string
	ns                string // its network namespace
	dir               string // under Lab.Dir
	run               string // under runRoot: sockets and runtime state
	kubeconfig        string // the kubelet's
}

func (n *node) cgroup() string           { return cgroupPrefix + n.name }
func (n *node) containerdSocket() string { return filepath.Join(n.run, "containerd.sock") }

// ctr runs containerd's client against the node's containerd, in the Kubernetes namespace.
func (n *node) ctr(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "ctr", append([]string{"--address", n.containerdSocket(), "--namespace", "k8s.io"}, args...)...).CombinedOutput()
}

func newLab(dir string, bins binaries, logf func(string, ...any)) *Lab {
	l := &Lab{Dir: dir, bins: bins, logf: logf}
	for _, s := range nodeSpecs {
		l.nodes = append(l.nodes, &node{name: s.name, ip: s.ip, podCIDR: s.podCIDR, ns: "kpc-" + s.name,
			dir: filepath.Join(dir, s.name), run: filepath.Join(runRoot, s.name)})
	}
	return l
}

// labNetNS is the lab namespace as the harness knows namespaces (for dialing into it).
func labNetNS() *harness.NetNS { return &harness.NetNS{Name: labNS} }

// setupNetwork creates the namespaces, the bridge, each node's link, and the routes between pod CIDRs.
func (l *Lab) setupNetwork(ctx context.Context) error {
	lines := [][]string{
		{"netns", "add", labNS},
		{"-n", labNS, "link", "set", "lo", "up"},
		{"-n", labNS, "link", "add", labBridge, "type", "bridge"},
		{"-n", labNS, "addr", "add", labIP + labPrefix, "dev", labBridge},
		{"-n", labNS, "link", "set", labBridge, "up"},
	}
	for i, n := range l.nodes {
		port := fmt.Sprintf("kpc-%c", 'a'+i)
		lines = append(lines,
			[]string{"netns", "add", n.ns},
			[]string{"-n", n.ns, "link", "set", "lo", "up"},
			[]string{"-n", labNS, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", n.ns},
			[]string{"-n", labNS, "link", "set", port, "master", labBridge, "up"},
			[]string{"-n", n.ns, "addr", "add", n.ip + labPrefix, "dev", "eth0"},
			[]string{"-n", n.ns, "link", "set", "eth0", "up"},
			[]string{"-n", n.ns, "route", "add", "default", "via", labIP},
			[]string{"-n", labNS, "route", "add", n.podCIDR, "via", n.ip},
		)
		for _, o := range l.nodes {
			if o != n {
				lines = append(lines, []string{"-n", n.ns, "route", "add", o.podCIDR, "via", o.ip})
			}
		}
	}
	for _, args := range lines {
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	for _, n := range l.nodes {
		if err := sysctlIn(ctx, n.ns, "net.ipv4.ip_forward", "1"); err != nil {
			return err
		}
	}
	return nil
}

// sysctlIn sets a network sysctl inside the namespace ns (`ip netns exec` mounts that namespace's
// /proc/sys/net view for the one command).
func sysctlIn(ctx context.Context, ns, key, value string) error {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "sysctl", "-qw", key+"="+value).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sysctl %s in %s: %w: %s", key, ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// spawn starts argv inside the network namespace ns and the lab cgroup cgroup (pids hierarchy), with
// its output in Dir/logs/<name>.log. nsenter only enters the network namespace: the process keeps the
// host's mounts, so /sys/fs/cgroup stays whole for the kubelet and runc (`ip netns exec` would remount
// /sys).
func (l *Lab) spawn(name, ns, cgroup string, env []string, argv ...string) (*harness.Process, error) {
	procs := filepath.Join(cgroupRoot, "pids", cgroup, "cgroup.procs")
	script := `echo $$ >"$KPC_CGROUP_PROCS" && exec "$@"`
	args := append([]string{"--net=/run/netns/" + ns, "--", "sh", "-c", script, "sh"}, argv...)
	cmd := exec.Command("nsenter", args...)
	cmd.Env = append(append(os.Environ(), "KPC_CGROUP_PROCS="+procs), env...)
	if err := os.MkdirAll(filepath.Join(l.Dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	p, err := harness.StartProcess(name, cmd, filepath.Join(l.Dir, "logs", name+".log"))
	if err != nil {
		return nil, err
	}
	l.processes = append(l.processes, p)
	return p, nil
}

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// makeCgroup creates /<name> in the v1 hierarchies (the kubelet's cgroupRoot must exist in each), with
// cpuset's cpus and mems copied from the root so tasks may join it.
func makeCgroup(name string) error {
	hier, err := v1Hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hier {
		d := filepath.Join(cgroupRoot, h, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", d, err)
		}
		if h == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(cgroupRoot, h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("writing %s/%s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

// v1Hierarchies lists the cgroup v1 hierarchies mounted under cgroupRoot (the pids one is required:
// the lab tracks its processes there).
func v1Hierarchies() ([]string, error) {
	entries, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil, err
	}
	var out []string
	pids := false
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "unified" {
			continue
		}
		var st syscall.Statfs_t
		if syscall.Statfs(filepath.Join(cgroupRoot, e.Name()), &st) == nil && st.Type == 0x27e0eb { // CGROUP_SUPER_MAGIC
			out = append(out, e.Name())
			pids = pids || e.Name() == "pids"
		}
	}
	if !pids {
		return nil, errors.New("no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids: the lab needs a cgroup v1 (hybrid) host, as the kubelet here runs with failCgroupV1: false")
	}
	return out, nil
}

// teardown stops everything the lab (this run or an earlier one) started and removes what it made:
// processes in the lab's cgroups (killed by PID, until none is left), mounts under its directories,
// its network namespaces, its cgroups; then puts back the host sysctls the kubelets changed.
// It is safe to call when nothing is up.
func (l *Lab) teardown() error {
	var errs []error
	for _, p := range l.processes {
		_ = p.Stop(syscall.SIGTERM, 5*time.Second)
	}
	l.processes = nil
	if err := killCgroups(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, unmountUnder(l.Dir, runRoot))
	for _, ns := range l.namespaces() {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", ns, err, out))
			}
		}
	}
	errs = append(errs, removeCgroups(), os.RemoveAll(runRoot), l.restoreSysctls(), removeLogLinks(l.Dir))
	return errors.Join(errs...)
}

// containerLogLinks is where every kubelet links its containers' logs (a path fixed in the kubelet).
const containerLogLinks = "/var/log/containers"

// removeLogLinks removes the kubelets' links to container logs under dir that pods killed with the lab
// left behind; other links are not the lab's.
func removeLogLinks(dir string) error {
	entries, err := os.ReadDir(containerLogLinks)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		path := filepath.Join(containerLogLinks, e.Name())
		if target, err := os.Readlink(path); err == nil && strings.HasPrefix(target, dir+"/") {
			errs = append(errs, os.Remove(path))
		}
	}
	return errors.Join(errs...)
}

func (l *Lab) namespaces() []string {
	out := []string{labNS}
	for _, n := range l.nodes {
		out = append(out, n.ns)
	}
	return out
}

// killCgroups SIGKILLs every process in the lab's cgroups (pids hierarchy) until they are empty.
func killCgroups() error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := cgroupPIDs()
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still in the lab's cgroups after 30 s", pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// cgroupPIDs lists the processes in the lab's cgroups of the pids hierarchy.
func cgroupPIDs() []int {
	var pids []int
	roots, _ := filepath.Glob(filepath.Join(cgroupRoot, "pids", cgroupPrefix+"*"))
	for _, r := range roots {
		_ = filepath.WalkDir(r, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroups removes the lab's cgroups, deepest first, in every hierarchy (v2's included: runc
// mirrors cgroups there on a hybrid host).
func removeCgroups() error {
	roots, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", cgroupPrefix+"*"))
	var dirs []string
	for _, r := range roots {
		_ = filepath.WalkDir(r, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	var errs []error
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount point below the given directories, deepest first (the kubelets'
// volumes, containerd's snapshots and sandboxes' network namespaces, which containerd keeps under its
// state directory).
func unmountUnder(dirs ...string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		for _, d := range dirs {
			if mp == d || strings.HasPrefix(mp, d+"/") {
				points = append(points, mp)
			}
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, mp := range points {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// sysctlFile is where saveSysctls keeps the host's values until restoreSysctls puts them back. It lives
// outside Dir, which the next run wipes, and survives a crash so the next run restores them first.
func (l *Lab) sysctlFile() string { return filepath.Join(filepath.Dir(l.Dir), "host-sysctls.json") }

func (l *Lab) saveSysctls() error {
	if _, err := os.Stat(l.sysctlFile()); err == nil {
		return nil // saved by a run that did not restore them: those are the host's values
	}
	vals := map[string]string{}
	for _, k := range hostSysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			return err
		}
		vals[k] = strings.TrimSpace(string(b))
	}
	b, _ := json.Marshal(vals)
	return os.WriteFile(l.sysctlFile(), b, 0o644)
}

func (l *Lab) restoreSysctls() error {
	b, err := os.ReadFile(l.sysctlFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var vals map[string]string
	if err := json.Unmarshal(b, &vals); err != nil {
		return fmt.Errorf("reading %s: %w", l.sysctlFile(), err)
	}
	var errs []error
	for k, v := range vals {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring %s: %w", k, err))
		}
	}
	if len(errs) == 0 {
		return os.Remove(l.sysctlFile())
	}
	return errors.Join(errs...)
}
