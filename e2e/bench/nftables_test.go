package main

import (
	"slices"
	"strings"
	"testing"
)

// A listing in nft 1.0.6's layout, cut down: elements spread over lines, a no-endpoint map with
// comments, a rule matching "ct status dnat" (no DNAT of its own), one Service with a numgen map and one
// with a single endpoint.
const sampleListing = `table ip kube-proxy {
	comment "rules for kube-proxy"
	set cluster-ips {
		type ipv4_addr
		comment "Active ClusterIPs"
		elements = { 10.96.0.7, 10.96.0.8 }
	}

	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.9 . tcp . 80 comment "bench/svc-00009:http" : goto reject-chain }
	}

	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.7 . tcp . 80 : goto service-A-bench/svc-00007/tcp/http,
			     10.96.0.8 . tcp . 80 : goto service-B-bench/svc-00008/tcp/http,
			     10.96.0.8 . udp . 53 : goto service-C-bench/svc-00008/udp/dns }
	}

	chain masquerading {
		meta mark & 0x00004000 == 0x00000000 return
		ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
	}

	chain service-A-bench/svc-00007/tcp/http {
		meta l4proto tcp dnat ip to numgen random mod 3 map { 0 : 10.244.128.22 . 8080, 1 : 10.244.128.23 . 8080, 2 : 10.244.128.21 . 8080 }
	}

	chain service-B-bench/svc-00008/tcp/http {
		meta l4proto tcp dnat to 10.244.128.24:8080
	}
}
`

func TestParseNFTListing(t *testing.T) {
	l, err := parseNFTListing(sampleListing)
	if err != nil {
		t.Fatal(err)
	}
	wantDispatch := map[string]string{
		"10.96.0.7:80": "service-A-bench/svc-00007/tcp/http",
		"10.96.0.8:80": "service-B-bench/svc-00008/tcp/http",
	}
	if len(l.Dispatch) != len(wantDispatch) {
		t.Errorf("dispatch %v, want %v", l.Dispatch, wantDispatch)
	}
	for k, v := range wantDispatch {
		if l.Dispatch[k] != v {
			t.Errorf("dispatch[%s] = %q, want %q", k, l.Dispatch[k], v)
		}
	}
	if got := l.Endpoints["service-A-bench/svc-00007/tcp/http"]; !slices.Equal(got, []string{"10.244.128.21:8080", "10.244.128.22:8080", "10.244.128.23:8080"}) {
		t.Errorf("endpoints of A: %v", got)
	}
	if got := l.Endpoints["service-B-bench/svc-00008/tcp/http"]; !slices.Equal(got, []string{"10.244.128.24:8080"}) {
		t.Errorf("endpoints of B: %v", got)
	}
	if len(l.Endpoints) != 2 || l.Chains != 3 {
		t.Errorf("%d chains with DNAT, %d chains; want 2 and 3", len(l.Endpoints), l.Chains)
	}

	if _, err := parseNFTListing("table ip kube-proxy {\n\tmap service-ips {\n\t\telements = { 10.96.0.7 . tcp . 80 : drop }\n\t}\n}\n"); err == nil {
		t.Error("a service-ips element without goto parsed")
	}
}

// The expected lines have the layout of upstream's nftables proxier tests (knftables' transaction text).
func TestNFTChangeText(t *testing.T) {
	chain := "service-LAUZTJTB-ns4/svc4/tcp/p80"
	got := nftChangeText(chain, []string{"10.180.0.4:80", "10.180.0.5:80"})
	want := "add chain ip kube-proxy " + chain + "\nflush chain ip kube-proxy " + chain + "\n" +
		"add rule ip kube-proxy " + chain + " meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.180.0.4 . 80 , 1 : 10.180.0.5 . 80 }\n"
	if got != want {
		t.Errorf("two endpoints:\n%s\nwant:\n%s", got, want)
	}
	got = nftChangeText(chain, []string{"10.180.0.1:80"})
	if !strings.HasSuffix(got, "add rule ip kube-proxy "+chain+" meta l4proto tcp dnat to 10.180.0.1:80\n") {
		t.Errorf("one endpoint:\n%s", got)
	}
}
