package main

import "testing"

// The vectors are seed 000's chains, which upstream kube-proxy wrote (see the design notes).
func TestChainNames(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{svcChain("default", "clusterip-service", ""), "KUBE-SVC-KUSV3H3OUX7H3MDQ"},
		{sepChain("default", "clusterip-service", "", "192.168.11.73:80"), "KUBE-SEP-HHZALBXPKUQGKXIS"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}
