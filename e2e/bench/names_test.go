package main

import "testing"

// The iptables vectors are seed 000's chains, which upstream kube-proxy wrote (see the design notes).
func TestChainNames(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{svcChain("default", "clusterip-service", ""), "KUBE-SVC-KUSV3H3OUX7H3MDQ"},
		{sepChain("default", "clusterip-service", "", "192.168.11.73:80"), "KUBE-SEP-HHZALBXPKUQGKXIS"},
		// Mode nftables: names in upstream v1.37.2's nftables proxier tests.
		{nftServiceChain("ns1", "svc1", "p80"), "service-ULMVA6XW-ns1/svc1/tcp/p80"},
		{nftServiceChain("ns2", "svc2", "p80"), "service-42NFTM6N-ns2/svc2/tcp/p80"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}
