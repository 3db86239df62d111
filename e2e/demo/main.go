// Command demo shows kube-proxy doing its job end to end on one machine: a real kube-apiserver and etcd on
// loopback, a "node" network namespace running the daemon, three "pod" namespaces running a small server,
// and a "client" namespace outside the node. It creates a NodePort Service over the three pods, sends 30
// requests to the ClusterIP and 30 to the NodePort, prints which pod answered each and the Service's rules,
// and removes everything. Run it as root through `make demo` (mode iptables) or `make demo MODE=nftables`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kube-proxy/e2e/harness"
)

const (
	namespace = "default"
	service   = "web"
	port      = 80
	podPort   = 8080
	nodePort  = 30080
	requests  = 30
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func step(format string, a ...any) func() {
	start := time.Now()
	fmt.Printf("==> "+format+" ... ", a...)
	return func() { fmt.Printf("done (%v)\n", time.Since(start).Round(time.Millisecond)) }
}

func run(ctx context.Context) (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root: the demo creates network namespaces (it never touches the host's own rules)")
	}
	dir, err := os.MkdirTemp("", "kube-proxy-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	done := step("starting a real kube-apiserver and etcd on loopback")
	cluster, err := harness.StartCluster(ctx, dir+"/cluster")
	if err != nil {
		return err
	}
	defer cluster.Stop()
	done()

	done = step("creating a node, three pod namespaces and a client namespace")
	topo, err := harness.NewTopology(ctx, 3)
	if err != nil {
		return err
	}
	defer topo.Close()
	if err := topo.StartServers(ctx, []int{podPort}, nil); err != nil {
		return err
	}
	if err := harness.ApplyNode(ctx, cluster, "node-a", topo.NodeIP, harness.PodCIDR, nil); err != nil {
		return err
	}
	done()

	mode := os.Getenv("KP_MODE")
	if mode == "" {
		mode = "iptables"
	}
	if mode != "iptables" && mode != "nftables" {
		return fmt.Errorf("MODE=%s: the demo runs mode iptables or nftables", mode)
	}
	done = step("starting kube-proxy (mode %s) in the node namespace as system:kube-proxy", mode)
	kubeconfig, stopBridge, err := cluster.Bridge(topo.Node)
	if err != nil {
		return err
	}
	defer stopBridge()
	d, err := harness.LaunchDaemon(topo.Node, dir, harness.DaemonOptions{Kubeconfig: kubeconfig,
		Config: "mode: " + mode + "\nclusterCIDR: " + harness.PodCIDR + "\n" + mode + ":\n  minSyncPeriod: 0s\n"})
	if d != nil {
		defer d.Close()
	}
	if err != nil {
		return err
	}
	done()

	done = step("creating Service %s/%s (NodePort %d) over the three pods", namespace, service, nodePort)
	clusterIP, err := createService(ctx, cluster, topo)
	if err != nil {
		return err
	}
	done()

	done = step("waiting for the rules to reach the kernel")
	if err := waitReachable(ctx, topo.Client, clusterIP); err != nil {
		return fmt.Errorf("%w\nkube-proxy log:\n%s", err, d.Proc.LogTail(20))
	}
	done()

	for _, target := range []struct{ what, addr string }{
		{"ClusterIP " + clusterIP, fmt.Sprintf("%s:%d", clusterIP, port)},
		{"NodePort " + topo.NodeIP, fmt.Sprintf("%s:%d", topo.NodeIP, nodePort)},
	} {
		counts, err := harness.Hit(ctx, topo.Client, "tcp", target.addr, requests)
		if err != nil {
			return err
		}
		fmt.Printf("\n%d requests from the client namespace to %s (%s):\n", requests, target.what, target.addr)
		printCounts(counts)
	}
	if mode == "nftables" {
		out, _ := topo.Node.Run(ctx, "nft", "list", "table", "ip", "kube-proxy")
		fmt.Printf("\nThe Service's chains and map entries in the node's nftables table ip kube-proxy:\n")
		printService(out)
	} else {
		out, _ := topo.Node.Run(ctx, "iptables-save", "-t", "nat")
		fmt.Printf("\nThe Service's rules in the node's nat table:\n")
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, namespace+"/"+service) {
				fmt.Println("  " + line)
			}
		}
	}
	fmt.Println("==> cleaning up: kube-proxy, namespaces, apiserver, etcd")
	return nil
}

// printService prints the lines of an nft listing that belong to the Service: its chains, and the map
// elements that point at them.
func printService(listing string) {
	name := namespace + "/" + service
	in := false
	for _, line := range strings.Split(listing, "\n") {
		t := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(t, "chain ") && strings.Contains(t, name):
			in = true
			fmt.Println("  " + t)
		case in && t == "}":
			in = false
			fmt.Println("  }")
		case in:
			fmt.Println("      " + t)
		case strings.Contains(t, name) && strings.Contains(t, "goto"):
			t = strings.TrimPrefix(t, "elements = { ")
			fmt.Println("  " + strings.TrimSuffix(strings.TrimSuffix(t, " }"), ","))
		}
	}
}

func createService(ctx context.Context, c *harness.Cluster, topo *harness.Topology) (string, error) {
	svc, err := c.Admin.CoreV1().Services(namespace).Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: service},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, Ports: []v1.ServicePort{{
			Name: "http", Port: port, TargetPort: intstr.FromInt32(podPort), NodePort: nodePort, Protocol: v1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating Service: %w", err)
	}
	name, proto, p, ready := "http", v1.ProtocolTCP, int32(podPort), true
	slice := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: service + "-1", Labels: map[string]string{discovery.LabelServiceName: service}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &name, Protocol: &proto, Port: &p}},
	}
	for _, pod := range topo.Pods {
		node := "node-a"
		slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{Addresses: []string{pod.IP},
			Conditions: discovery.EndpointConditions{Ready: &ready}, NodeName: &node})
	}
	if _, err := c.Admin.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("creating EndpointSlice: %w", err)
	}
	return svc.Spec.ClusterIP, nil
}

func waitReachable(ctx context.Context, from *harness.NetNS, clusterIP string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		counts, err := harness.Hit(ctx, from, "tcp", fmt.Sprintf("%s:%d", clusterIP, port), 1)
		if err == nil {
			for k := range counts {
				if !strings.HasPrefix(k, "ERR") {
					return nil
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the ClusterIP did not answer within 30 s")
}

func printCounts(counts map[string]int) {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("  %-6s %3d  %s\n", k, counts[k], strings.Repeat("#", counts[k]))
	}
}
