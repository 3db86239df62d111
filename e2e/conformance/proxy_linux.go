package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kube-proxy/e2e/harness"
)

// The two ways kube-proxy runs on the lab's nodes.
const (
	// wayProcess is the hard way: the binary in the node's namespace with a config file and a
	// kubeconfig, as systemd/kube-proxy.service runs it.
	wayProcess = "process"
	// wayDaemonSet is kubeadm's way: packaging/kubernetes/kube-proxy.yaml applied with the edits its
	// header asks for, our image (packaging/container/Dockerfile) in the pods.
	wayDaemonSet = "daemonset"
)

// ourImage is the tag the lab gives the image built from packaging/container/Dockerfile, and the
// reference the DaemonSet names (a runtime reads "kube-proxy:conformance" as this).
const (
	ourImage    = "kube-proxy:conformance"
	ourImageRef = "docker.io/library/" + ourImage
)

// proxyRun is a kube-proxy running on every node, however it was started.
type proxyRun struct {
	spec     runSpec
	procs    []*harness.Process // wayProcess
	manifest string             // wayDaemonSet: the applied manifest
}

// hardWayConfig is the config file of the hard way for node n: the example config's essentials, as a
// user writes them (mode, the node's name, the pod CIDR, the kubeconfig), everything else defaulted.
func (l *Lab) hardWayConfig(n *node, mode string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
mode: %s
clusterCIDR: %s
`, l.kubeconfig("kube-proxy"), n.name, mode, clusterCIDR)
}

// startProxy starts the run's kube-proxy on every node and waits until each answers /healthz with 200
// on its node address (upstream's health server, which both implementations serve).
func (l *Lab) startProxy(ctx context.Context, cs kubernetes.Interface, spec runSpec) (*proxyRun, error) {
	run := &proxyRun{spec: spec}
	switch spec.Way {
	case wayProcess:
		bin := l.bins.ours
		if spec.Impl == implUpstream {
			bin = filepath.Join(l.bins.cluster, "kube-proxy")
		}
		for _, n := range l.nodes {
			conf := filepath.Join(n.dir, "kube-proxy-config.yaml")
			if err := os.WriteFile(conf, []byte(l.hardWayConfig(n, spec.Mode)), 0o644); err != nil {
				return nil, err
			}
			p, err := l.spawn(fmt.Sprintf("kube-proxy-%s-%s", spec.Name(), n.name), n.ns, n.cgroup()+"/system", nil,
				bin, "--config="+conf, "--v=2")
			if err != nil {
				return nil, err
			}
			run.procs = append(run.procs, p)
		}
	case wayDaemonSet:
		manifest, err := l.daemonSetManifest(spec.Mode)
		if err != nil {
			return nil, err
		}
		run.manifest = manifest
		if out, err := l.kubectl(ctx, "apply", "-f", manifest); err != nil {
			return nil, fmt.Errorf("kubectl apply -f %s: %w: %s", manifest, err, out)
		}
	default:
		return nil, fmt.Errorf("unknown way %q", spec.Way)
	}
	err := waitFor(ctx, "kube-proxy healthy on every node", 3*time.Minute, func() error {
		for _, p := range run.procs {
			if p.Exited() {
				return errStop(fmt.Errorf("%s exited: %s", p.Name, p.LogTail(20)))
			}
		}
		for _, n := range l.nodes {
			if err := healthz(n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && spec.Way == wayDaemonSet {
		out, _ := l.kubectl(ctx, "-n", "kube-system", "describe", "pods", "-l", "k8s-app=kube-proxy")
		logs, _ := l.kubectl(ctx, "-n", "kube-system", "logs", "-l", "k8s-app=kube-proxy", "--tail=20")
		err = fmt.Errorf("%w\n%s\n%s", err, tailLines(out, 30), logs)
	}
	if err != nil {
		return run, err
	}
	return run, nil
}

// healthz asks kube-proxy's health server on n's address, from the lab namespace.
func healthz(n *node) error {
	resp, err := labNetNS().HTTPClient().Get("http://" + n.ip + ":10256/healthz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s /healthz: %d %s", n.name, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}

// stopProxy stops the run's kube-proxy and removes its rules from every node with our --cleanup
// (which removes what either implementation wrote, in any mode), so the next run starts clean.
func (l *Lab) stopProxy(ctx context.Context, cs kubernetes.Interface, run *proxyRun) error {
	if run == nil {
		return nil
	}
	for _, p := range run.procs {
		if err := p.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
			l.logf("stopping %s: %v", p.Name, err)
		}
	}
	if run.manifest != "" {
		if out, err := l.kubectl(ctx, "delete", "--wait=true", "-f", run.manifest); err != nil {
			return fmt.Errorf("kubectl delete -f %s: %w: %s", run.manifest, err, out)
		}
		if err := waitFor(ctx, "the kube-proxy pods to be gone", 2*time.Minute, func() error {
			pods, err := cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-proxy"})
			if err != nil {
				return err
			}
			if len(pods.Items) > 0 {
				return fmt.Errorf("%d pods left", len(pods.Items))
			}
			return nil
		}); err != nil {
			return err
		}
	}
	for _, n := range l.nodes {
		cmd := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+n.ns, "--", l.bins.ours, "--cleanup")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kube-proxy --cleanup on %s: %w: %s", n.name, err, tailLines(string(out), 10))
		}
	}
	return nil
}

// daemonSetManifest writes packaging/kubernetes/kube-proxy.yaml with the edits its header tells a user
// to make (the API server's address, the pod CIDR) and the ones make release makes (the image), plus
// the run's mode. Each edit must match exactly once, so a change to the manifest that the lab would
// silently not follow fails here.
func (l *Lab) daemonSetManifest(mode string) (string, error) {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "packaging/kubernetes/kube-proxy.yaml"))
	if err != nil {
		return "", err
	}
	text := string(b)
	edits := []struct{ old, new string }{
		{"server: https://control-plane.example:6443", "server: " + apiServer},
		{"clusterCIDR: 10.244.0.0/16", "clusterCIDR: " + clusterCIDR},
		{"mode: iptables", "mode: " + mode},
		{"image: kube-proxy:dev", "image: " + ourImage},
	}
	for _, e := range edits {
		if n := strings.Count(text, e.old); n != 1 {
			return "", fmt.Errorf("packaging/kubernetes/kube-proxy.yaml: %q appears %d times, want once", e.old, n)
		}
		text = strings.Replace(text, e.old, e.new, 1)
	}
	path := filepath.Join(l.Dir, "kube-proxy-"+mode+".yaml")
	return path, os.WriteFile(path, []byte(text), 0o644)
}

// kubectl runs kubectl as the admin in the lab namespace.
func (l *Lab) kubectl(ctx context.Context, args ...string) (string, error) {
	argv := append([]string{"--net=/run/netns/" + labNS, "--", l.bins.k8s("kubectl"), "--kubeconfig=" + l.admin}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", argv...).CombinedOutput()
	return string(out), err
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
