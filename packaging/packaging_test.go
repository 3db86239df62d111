package packaging

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"

	"kube-proxy/config"
)

// sourceDateEpoch pins the archives' times so builds can be compared byte for byte.
const sourceDateEpoch = "1700000000"

func requireTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (Debian: apt-get install dpkg tar gzip)", tool)
		}
	}
}

// fakeBinary writes a small stand-in for the kube-proxy binary: the scripts only copy it.
func fakeBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kube-proxy")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho fake kube-proxy\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(append(os.Environ(), "SOURCE_DATE_EPOCH="+sourceDateEpoch), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// manifestObjects decodes kubernetes/kube-proxy.yaml strictly (an unknown or duplicated field fails).
func manifestObjects(t *testing.T) []runtime.Object {
	t.Helper()
	f, err := os.Open("kubernetes/kube-proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var objs []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decoding manifest document:\n%s\n%v", doc, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// TestManifests checks that the DaemonSet's pieces fit together the way kubeadm's do: the ConfigMap's
// config loads with our strict loader and points at the mounted kubeconfig, the command reads the mounted
// config, the binding grants system:node-proxier to the pod's service account, and the pod has what the
// dataplanes need from the host.
func TestManifests(t *testing.T) {
	var (
		sa  *corev1.ServiceAccount
		crb *rbacv1.ClusterRoleBinding
		cm  *corev1.ConfigMap
		ds  *appsv1.DaemonSet
	)
	for _, o := range manifestObjects(t) {
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			sa = o
		case *rbacv1.ClusterRoleBinding:
			crb = o
		case *corev1.ConfigMap:
			cm = o
		case *appsv1.DaemonSet:
			ds = o
		default:
			t.Errorf("unexpected object %T", o)
		}
	}
	if sa == nil || crb == nil || cm == nil || ds == nil {
		t.Fatalf("want a ServiceAccount, ClusterRoleBinding, ConfigMap and DaemonSet; got %v %v %v %v", sa != nil, crb != nil, cm != nil, ds != nil)
	}
	const ns = "kube-system"
	for _, m := range []struct{ kind, ns, name string }{
		{"ServiceAccount", sa.Namespace, sa.Name}, {"ConfigMap", cm.Namespace, cm.Name}, {"DaemonSet", ds.Namespace, ds.Name},
	} {
		if m.ns != ns || m.name != "kube-proxy" {
			t.Errorf("%s is %s/%s, want kube-system/kube-proxy (kubeadm's names)", m.kind, m.ns, m.name)
		}
	}
	if crb.RoleRef != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:node-proxier"}) {
		t.Errorf("ClusterRoleBinding roleRef = %+v", crb.RoleRef)
	}
	if want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: ns}}; !cmp.Equal(crb.Subjects, want) {
		t.Errorf("ClusterRoleBinding subjects = %+v, want %+v", crb.Subjects, want)
	}

	pod := ds.Spec.Template.Spec
	if pod.ServiceAccountName != sa.Name || !pod.HostNetwork || pod.PriorityClassName != "system-node-critical" {
		t.Errorf("pod: serviceAccountName %q hostNetwork %v priorityClassName %q", pod.ServiceAccountName, pod.HostNetwork, pod.PriorityClassName)
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0] != (corev1.Toleration{Operator: corev1.TolerationOpExists}) {
		t.Errorf("tolerations = %+v, want one that tolerates every taint", pod.Tolerations)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the container is not privileged (sysctls need a writable /proc/sys)")
	}
	if len(c.Command) == 0 || c.Command[0] != "/usr/local/bin/kube-proxy" {
		t.Errorf("command = %q, want upstream's binary path first", c.Command)
	}
	if !cmp.Equal(c.Env, []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}) || !contains(c.Command, "--hostname-override=$(NODE_NAME)") {
		t.Errorf("the node name is not passed as upstream does: env %+v command %q", c.Env, c.Command)
	}

	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
		if _, ok := volumes[m.Name]; !ok {
			t.Errorf("mount %s uses undefined volume %q", m.MountPath, m.Name)
		}
	}
	hostPath := func(mountPath, path string, typ *corev1.HostPathType, readOnly bool) {
		t.Helper()
		m, ok := mounts[mountPath]
		if !ok {
			t.Errorf("nothing mounted at %s", mountPath)
			return
		}
		hp := volumes[m.Name].HostPath
		if hp == nil || hp.Path != path || !cmp.Equal(hp.Type, typ) || m.ReadOnly != readOnly {
			t.Errorf("%s: hostPath %+v readOnly %v, want %s type %v readOnly %v", mountPath, hp, m.ReadOnly, path, typ, readOnly)
		}
	}
	fileOrCreate := corev1.HostPathFileOrCreate
	hostPath("/run/xtables.lock", "/run/xtables.lock", &fileOrCreate, false)
	hostPath("/lib/modules", "/lib/modules", nil, true)

	// The config flag names a file of the mounted ConfigMap, and that file's kubeconfig is the other key.
	var configPath string
	for _, a := range c.Command {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			configPath = v
		}
	}
	m, ok := mounts[filepath.Dir(configPath)]
	if !ok || volumes[m.Name].ConfigMap == nil || volumes[m.Name].ConfigMap.Name != cm.Name {
		t.Fatalf("--config=%s is not in the mounted ConfigMap %s", configPath, cm.Name)
	}
	if configPath != "/var/lib/kube-proxy/config.conf" {
		t.Errorf("--config=%s, want kubeadm's /var/lib/kube-proxy/config.conf", configPath)
	}
	cfg, err := config.Decode("config.conf", []byte(cm.Data[filepath.Base(configPath)]))
	if err != nil {
		t.Fatalf("the ConfigMap's config.conf does not load: %v", err)
	}
	kc := cfg.ClientConnection.Kubeconfig
	if filepath.Dir(kc) != filepath.Dir(configPath) || cm.Data[filepath.Base(kc)] == "" {
		t.Errorf("config.conf's kubeconfig %s is not a key of the mounted ConfigMap", kc)
	}
	kcfg, err := clientcmd.Load([]byte(cm.Data[filepath.Base(kc)]))
	if err != nil {
		t.Fatalf("kubeconfig.conf: %v", err)
	}
	// (clientcmd.Validate would also open the CA file, which exists only in a pod.)
	if ctx := kcfg.Contexts[kcfg.CurrentContext]; ctx == nil || kcfg.Clusters[ctx.Cluster] == nil || kcfg.AuthInfos[ctx.AuthInfo] == nil {
		t.Errorf("kubeconfig.conf: current context %q does not name a defined cluster and user", kcfg.CurrentContext)
	} else if !strings.HasPrefix(kcfg.Clusters[ctx.Cluster].Server, "https://") {
		t.Errorf("kubeconfig.conf: server %q is not https", kcfg.Clusters[ctx.Cluster].Server)
	}
	for _, u := range kcfg.AuthInfos {
		if u.TokenFile != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
			t.Errorf("kubeconfig.conf authenticates with %+v, want the service account token", u)
		}
	}

	// release.sh sets the image by rewriting the manifest's only image line.
	b, err := os.ReadFile("kubernetes/kube-proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(regexp.MustCompile(`(?m)^\s*image:`).FindAll(b, -1)); n != 1 {
		t.Errorf("the manifest has %d image lines, release.sh needs exactly one", n)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestDebianVersion checks the mapping of git-describe strings to Debian versions, and that dpkg orders
// them as the releases are ordered.
func TestDebianVersion(t *testing.T) {
	requireTools(t, "dpkg")
	tests := []struct{ describe, want string }{
		{"v1.2.3", "1.2.3"},
		{"v1.2.3-rc.1", "1.2.3~rc.1"},
		{"v1.2.3-4-gabc1234", "1.2.3+4.gabc1234"},
		{"v1.2.3-4-gabc1234-dirty", "1.2.3+4.gabc1234+dirty"},
		{"v1.2.3-rc.1-2-gdeadbee", "1.2.3~rc.1+2.gdeadbee"},
		{"abc1234", "0.0.0~gitabc1234"},
		{"abc1234-dirty", "0.0.0~gitabc1234+dirty"},
		{"5502ccb-dirty", "0.0.0~git5502ccb+dirty"}, // a hash that starts with a digit is still a hash
		{"v0.0.0-dev", "0.0.0~dev"},
	}
	for _, tt := range tests {
		if got := run(t, nil, "./deb.sh", "--debian-version", tt.describe); got != tt.want {
			t.Errorf("%s: got %s, want %s", tt.describe, got, tt.want)
		}
	}
	// Each version sorts before the next, as git history does.
	order := []string{"0.0.0~gitabc1234", "1.2.3~rc.1", "1.2.3~rc.1+2.gdeadbee", "1.2.3", "1.2.3+4.gabc1234", "1.2.4~rc.1"}
	for i := 0; i+1 < len(order); i++ {
		if err := exec.Command("dpkg", "--compare-versions", order[i], "lt", order[i+1]).Run(); err != nil {
			t.Errorf("dpkg does not order %s before %s", order[i], order[i+1])
		}
	}
}

// TestDebPackage builds a .deb around a stand-in binary and checks its metadata and files.
func TestDebPackage(t *testing.T) {
	requireTools(t, "dpkg-deb", "git")
	out := t.TempDir()
	deb := run(t, []string{"KP_DEB_COMPRESSION=gzip"}, "./deb.sh", fakeBinary(t), "arm64", "v1.2.3-4-gabc1234", out)
	if want := filepath.Join(out, "kube-proxy_1.2.3+4.gabc1234_arm64.deb"); deb != want {
		t.Fatalf("deb.sh printed %s, want %s", deb, want)
	}
	field := func(name string) string { return run(t, nil, "dpkg-deb", "--field", deb, name) }
	for name, want := range map[string]string{"Package": "kube-proxy", "Version": "1.2.3+4.gabc1234", "Architecture": "arm64", "Depends": "iptables"} {
		if got := field(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}

	dir := t.TempDir()
	run(t, nil, "dpkg-deb", "--raw-extract", deb, dir)
	files := map[string]os.FileMode{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files["/"+rel] = info.Mode().Perm()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]os.FileMode{
		"/usr/bin/kube-proxy":                        0o755,
		"/usr/lib/systemd/system/kube-proxy.service": 0o644,
		"/var/lib/kube-proxy/kube-proxy-config.yaml": 0o644,
		"/usr/share/doc/kube-proxy/README.md":        0o644,
		"/usr/share/doc/kube-proxy/INSTALL.md":       0o644,
		"/DEBIAN/control":                            0o644,
		"/DEBIAN/conffiles":                          0o644,
		"/DEBIAN/md5sums":                            0o644,
		"/DEBIAN/postinst":                           0o755,
		"/DEBIAN/prerm":                              0o755,
		"/DEBIAN/postrm":                             0o755,
	}
	if diff := cmp.Diff(want, files); diff != "" {
		t.Errorf("package files and modes (-want +got):\n%s", diff)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read("DEBIAN/conffiles"); got != "/var/lib/kube-proxy/kube-proxy-config.yaml\n" {
		t.Errorf("conffiles = %q", got)
	}
	example, err := os.ReadFile("../kube-proxy-config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if read("var/lib/kube-proxy/kube-proxy-config.yaml") != string(example) {
		t.Error("the packaged config is not kube-proxy-config.example.yaml")
	}

	// The packaged unit is the hard-way unit with only the binary's path changed (and its install comment).
	src, err := os.ReadFile("../systemd/kube-proxy.service")
	if err != nil {
		t.Fatal(err)
	}
	directives := func(unit string) []string {
		var out []string
		for _, l := range strings.Split(unit, "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				out = append(out, l)
			}
		}
		return out
	}
	wantUnit := directives(strings.ReplaceAll(string(src), "/usr/local/bin/kube-proxy", "/usr/bin/kube-proxy"))
	if diff := cmp.Diff(wantUnit, directives(read("usr/lib/systemd/system/kube-proxy.service"))); diff != "" {
		t.Errorf("packaged unit (-want +got):\n%s", diff)
	}
	if strings.Contains(read("usr/lib/systemd/system/kube-proxy.service"), "/usr/local") {
		t.Error("the packaged unit still mentions /usr/local")
	}
	for _, script := range []string{"postinst", "prerm", "postrm"} {
		if out, err := exec.Command("sh", "-n", filepath.Join(dir, "DEBIAN", script)).CombinedOutput(); err != nil {
			t.Errorf("%s: %v: %s", script, err, out)
		}
	}
}

// TestTarball builds the release tarball twice around a stand-in binary: the same bytes both times, and the
// layout the install guide's commands expect.
func TestTarball(t *testing.T) {
	requireTools(t, "tar", "gzip", "git")
	bin := fakeBinary(t)
	a := run(t, nil, "./tarball.sh", bin, "amd64", "v9.8.7", t.TempDir())
	b := run(t, nil, "./tarball.sh", bin, "amd64", "v9.8.7", t.TempDir())
	if filepath.Base(a) != "kube-proxy-v9.8.7-linux-amd64.tar.gz" {
		t.Errorf("tarball named %s", filepath.Base(a))
	}
	ab, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	bb, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ab, bb) {
		t.Error("two builds of the same tarball differ")
	}
	zr, err := gzip.NewReader(bytes.NewReader(ab))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.ModTime.Unix() != 1700000000 {
			t.Errorf("%s: uid %d gid %d mtime %v, want root-owned at SOURCE_DATE_EPOCH", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		got[h.Name] = os.FileMode(h.Mode).Perm().String()
	}
	d := "kube-proxy-v9.8.7-linux-amd64/"
	want := map[string]string{
		d: "-rwxr-xr-x", d + "kube-proxy": "-rwxr-xr-x", d + "systemd/": "-rwxr-xr-x",
		d + "systemd/kube-proxy.service": "-rw-r--r--", d + "kube-proxy-config.example.yaml": "-rw-r--r--",
		d + "README.md": "-rw-r--r--", d + "INSTALL.md": "-rw-r--r--",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tarball entries (-want +got):\n%s", diff)
	}
}

func TestReadmeExcerpt(t *testing.T) {
	got := run(t, nil, "./readme-excerpt.sh", "../README.md", "v1.0.0", "linux/amd64")
	for _, want := range []string{"Release v1.0.0 for linux/amd64", "## Install", "INSTALL.md"} {
		if !strings.Contains(got, want) {
			t.Errorf("excerpt lacks %q:\n%s", want, got)
		}
	}
	bad := filepath.Join(t.TempDir(), "README.md")
	if err := os.WriteFile(bad, []byte("# x\n\nintro\n\n## Usage\n\nno install section\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("./readme-excerpt.sh", bad, "v1", "linux/amd64").CombinedOutput(); err == nil {
		t.Errorf("a README without an install section was accepted:\n%s", out)
	}
}
