package harness

import "fmt"

// Addresses of the data-plane test bed built by NewTopology. Pod i (from 1) is PodIP(i) on its eth0,
// with the node's side of its veth at PodGatewayIP(i).
const (
	// ServiceCIDR is the apiserver's --service-cluster-ip-range and the range the node routes
	// towards its primary interface, so that locally originated connections to ClusterIPs work.
	ServiceCIDR = "10.96.0.0/16"
	// ServiceCIDRv6 is the IPv6 service range, used by dual-stack clusters and topologies.
	ServiceCIDRv6 = "fd00:10:96::/112"
	// PodCIDR is the cluster CIDR all pod addresses are in (kube-proxy's clusterCIDR).
	PodCIDR = "10.244.0.0/16"
	// PodCIDRv6 is the IPv6 cluster CIDR.
	PodCIDRv6 = "fd00:10:244::/48"
	// NodeIP is the node's primary address, on its eth0 towards the client, outside PodCIDR.
	NodeIP = "10.250.0.1"
	// ClientIP is the client namespace's address, on the node's primary network.
	ClientIP = "10.250.0.2"
	// NodeIPv6 is the node's primary IPv6 address.
	NodeIPv6 = "fd00:10:250::1"
	// ClientIPv6 is the client's IPv6 address.
	ClientIPv6 = "fd00:10:250::2"
)

// Addresses of a two-node topology (TopologyOptions.NodeBPods): node B is a second node on the node's
// primary network, with pods of its own numbered from NodeBPodBase+1, so that node B's pod i is
// PodIP(NodeBPodBase+i), 10.244.<100+i>.2, and every address helper above applies to it too.
const (
	// NodeBIP is node B's primary address, beside NodeIP and ClientIP on one shared network.
	NodeBIP = "10.250.0.3"
	// NodeBPodBase is added to the number of node B's pods: its first pod is pod 101.
	NodeBPodBase = 100
	// NodePodCIDR is the bed's node's pod range in a two-node topology (pods 1..63): node B routes it
	// via NodeIP, and it is the node's podCIDR in the API.
	NodePodCIDR = "10.244.0.0/18"
	// NodeBPodCIDR is node B's pod range (pods 101..127): the bed's node routes it via NodeBIP, and it
	// is node B's podCIDR in the API.
	NodeBPodCIDR = "10.244.64.0/18"
)

// PodIP returns the IPv4 address of pod i (from 1): 10.244.<i>.2.
func PodIP(i int) string { return fmt.Sprintf("10.244.%d.2", i) }

// PodGatewayIP returns the node's address on pod i's veth: 10.244.<i>.1.
func PodGatewayIP(i int) string { return fmt.Sprintf("10.244.%d.1", i) }

// PodIPv6 returns the IPv6 address of pod i (from 1): fd00:10:244:<i>::2.
func PodIPv6(i int) string { return fmt.Sprintf("fd00:10:244:%x::2", i) }

// PodGatewayIPv6 returns the node's IPv6 address on pod i's veth: fd00:10:244:<i>::1.
func PodGatewayIPv6(i int) string { return fmt.Sprintf("fd00:10:244:%x::1", i) }
