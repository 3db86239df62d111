package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// containerdConfig is a private containerd for one node: its own root, state, sockets, runc root and
// CNI configuration; sandboxes' network namespaces under its state directory (so teardown finds them);
// no AppArmor, and oom_score_adj kept within what this host allows (it has no CAP_SYS_RESOURCE).
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[7]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[8]q
`

// cniConfig is the node's pod network: a bridge (the pods' gateway), host-local addresses from the
// node's pod CIDR, hairpin mode on (a pod reaching itself through its Service), no masquerading
// (kube-proxy's job), portmap for hostPorts.
const cniConfig = `{
  "cniVersion": "0.4.0",
  "name": "kpc",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %[1]q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %[2]q}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
`

// kubeletConfig is the node's kubelet: cgroup v1 with the cgroupfs driver (this host), its own cgroup
// root, webhook authentication and authorization, cluster DNS, and eviction thresholds low enough for a
// shared disk.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%[1]s
containerRuntimeEndpoint: unix://%[2]s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]q}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [%[4]s]
resolvConf: %[5]q
failSwapOn: false
podLogsDir: %[6]q
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
healthzBindAddress: 127.0.0.1
port: 10250
readOnlyPort: 0
`

// startNode registers the node (with its pod CIDR: the controller-manager does not allocate them
// here), starts its containerd, imports the images, writes its CNI configuration and starts its
// kubelet.
func (l *Lab) startNode(ctx context.Context, cs kubernetes.Interface, n *node, pause string, archives []string) error {
	for _, d := range []string{n.dir, n.run, filepath.Join(n.dir, "cni"), filepath.Join(n.dir, "pod-logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := makeCgroup(n.cgroup()); err != nil {
		return err
	}
	if err := makeCgroup(n.cgroup() + "/system"); err != nil {
		return err
	}
	nodeObj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name},
		Spec: corev1.NodeSpec{PodCIDR: n.podCIDR, PodCIDRs: []string{n.podCIDR}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, nodeObj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("registering node %s: %w", n.name, err)
	}

	conf := filepath.Join(n.dir, "containerd.toml")
	body := fmt.Sprintf(containerdConfig, filepath.Join(n.dir, "containerd"), filepath.Join(n.run, "containerd"),
		n.containerdSocket(), n.containerdSocket()+".ttrpc", filepath.Join(n.dir, "opt"), pause,
		filepath.Join(n.run, "runc"), filepath.Join(n.dir, "cni"))
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return err
	}
	cd, err := l.spawn("containerd-"+n.name, n.ns, n.cgroup()+"/system", nil, "containerd", "--config", conf)
	if err != nil {
		return err
	}
	if err := waitFor(ctx, "containerd on "+n.name, 60*time.Second, func() error {
		if cd.Exited() {
			return errStop(fmt.Errorf("containerd exited: %s", cd.LogTail(15)))
		}
		_, err := n.ctr(ctx, "version")
		return err
	}); err != nil {
		return err
	}
	for _, a := range archives {
		if out, err := n.ctr(ctx, "images", "import", a); err != nil {
			return fmt.Errorf("importing %s into %s: %w: %s", a, n.name, err, strings.TrimSpace(string(out)))
		}
	}

	cni := fmt.Sprintf(cniConfig, n.podCIDR, filepath.Join(n.dir, "cni-ipam"))
	if err := os.WriteFile(filepath.Join(n.dir, "cni", "10-kpc.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	resolv := filepath.Join(l.Dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+labIP+"\n"), 0o644); err != nil {
		return err
	}
	kconf := filepath.Join(n.dir, "kubelet.yaml")
	body = fmt.Sprintf(kubeletConfig, n.cgroup(), n.containerdSocket(), l.ca.CertFile(), dnsServiceIP, resolv,
		filepath.Join(n.dir, "pod-logs"))
	if err := os.WriteFile(kconf, []byte(body), 0o644); err != nil {
		return err
	}
	_, err = l.spawn("kubelet-"+n.name, n.ns, n.cgroup()+"/system", nil, l.bins.k8s("kubelet"),
		"--config="+kconf, "--kubeconfig="+l.kubeconfig("kubelet-"+n.name),
		"--root-dir="+filepath.Join(n.dir, "kubelet"), "--cert-dir="+filepath.Join(n.dir, "kubelet-pki"),
		"--hostname-override="+n.name, "--node-ip="+n.ip, "--v=2")
	return err
}

// waitNodesReady waits until every node reports Ready.
func (l *Lab) waitNodesReady(ctx context.Context, cs kubernetes.Interface) error {
	return waitFor(ctx, "the nodes to be Ready", 3*time.Minute, func() error {
		for _, p := range l.processes {
			if strings.HasPrefix(p.Name, "kubelet-") && p.Exited() {
				return errStop(fmt.Errorf("%s exited: %s", p.Name, p.LogTail(20)))
			}
		}
		for _, n := range l.nodes {
			obj, err := cs.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready := false
			for _, c := range obj.Status.Conditions {
				ready = ready || c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
			}
			if !ready {
				return fmt.Errorf("node %s is not Ready", n.name)
			}
		}
		return nil
	})
}
