package xtables

import "testing"

func TestChainsPayloads(t *testing.T) {
	chains := []string{"KUBE-A", "KUBE-B"}
	if got, want := string(DeleteChainsPayload("nat", chains)), "*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-X KUBE-A\n-X KUBE-B\nCOMMIT\n"; got != want {
		t.Errorf("DeleteChainsPayload:\n%s\nwant:\n%s", got, want)
	}
	if got, want := string(FlushChainsPayload("filter", chains)), "*filter\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\nCOMMIT\n"; got != want {
		t.Errorf("FlushChainsPayload:\n%s\nwant:\n%s", got, want)
	}
}
