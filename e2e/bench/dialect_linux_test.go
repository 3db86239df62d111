package main

import (
	"strings"
	"testing"
)

// TestNFTListingCheck checks the untimed check of the cold sync's end state against a listing.
func TestNFTListingCheck(t *testing.T) {
	l, err := parseNFTListing(sampleListing)
	if err != nil {
		t.Fatal(err)
	}
	a := &service{Name: "svc-00007", ClusterIP: "10.96.0.7", NFTChain: "service-A-bench/svc-00007/tcp/http",
		Endpoints: []string{"10.244.128.21:8080", "10.244.128.22:8080", "10.244.128.23:8080"}}
	if err := l.check([]*service{a}); err != nil {
		t.Error(err)
	}
	a.Endpoints = a.Endpoints[:2]
	if err := l.check([]*service{a}); err == nil || !strings.Contains(err.Error(), "DNATs to") {
		t.Errorf("check with an endpoint too many in the kernel: %v", err)
	}
	a.ClusterIP = "10.96.0.9"
	if err := l.check([]*service{a}); err == nil || !strings.Contains(err.Error(), "service-ips sends 10.96.0.9:80") {
		t.Errorf("check of a Service without an element: %v", err)
	}
}
