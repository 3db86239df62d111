package main

import (
	"slices"
	"testing"
	"time"
)

func TestParseOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		check   func(o options) bool
		wantErr bool
	}{
		{"defaults", nil, func(o options) bool {
			return slices.Equal(o.N, []int{1000, 5000, 10000}) && slices.Equal(o.M, []int{3, 10}) && o.Runs == 3 &&
				slices.Equal(o.Impls, []string{implOurs, implUpstream}) && o.Output == "BENCHMARKS.md" && o.Changes == 100 &&
				slices.Equal(o.Modes, []string{proxyIPTables, proxyNFTables}) && o.ColdCap == 20*time.Minute &&
				o.changesFor(proxyNFTables) == 100
		}, false},
		{"quick", []string{"-quick"}, func(o options) bool {
			return slices.Equal(o.N, []int{1000}) && slices.Equal(o.M, []int{3}) && o.Runs == 1 && o.Changes == 20 &&
				o.Output == "" && o.Quiesce == 2*time.Second && o.changesFor(proxyIPTables) == 20 && o.changesFor(proxyNFTables) == 6
		}, false},
		{"quick keeps explicit flags", []string{"-quick", "-changes", "40", "-o", "x.md"}, func(o options) bool {
			return o.Changes == 40 && o.Output == "x.md" && o.Runs == 1
		}, false},
		{"one implementation", []string{"-impl", "upstream", "-n", "2000"}, func(o options) bool {
			return slices.Equal(o.Impls, []string{implUpstream}) && slices.Equal(o.N, []int{2000})
		}, false},
		{"mode nftables up to 60,000 Services", []string{"-mode", "nftables", "-n", "1000,50000", "-cold-cap", "1m"}, func(o options) bool {
			return slices.Equal(o.Modes, []string{proxyNFTables}) && slices.Equal(o.N, []int{1000, 50000}) && o.ColdCap == time.Minute
		}, false},
		{"modes in the order given", []string{"-mode", "nftables,iptables"}, func(o options) bool {
			return slices.Equal(o.Modes, []string{proxyNFTables, proxyIPTables})
		}, false},
		{"mode iptables up to 30,000 Services", []string{"-mode", "iptables,nftables", "-n", "50000"}, nil, true},
		{"unknown mode", []string{"-mode", "ipvs"}, nil, true},
		{"odd nftables changes", []string{"-nft-changes", "3"}, nil, true},
		{"odd changes", []string{"-changes", "5"}, nil, true},
		{"decreasing sizes", []string{"-n", "5000,1000"}, nil, true},
		{"more changes than Services", []string{"-n", "10", "-changes", "20"}, nil, true},
		{"unknown implementation", []string{"-impl", "kube-router"}, nil, true},
		{"stray argument", []string{"now"}, nil, true},
	} {
		o, err := parseOptions(tc.args)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: error %v, want error %v", tc.name, err, tc.wantErr)
			continue
		}
		if err == nil && !tc.check(o) {
			t.Errorf("%s: unexpected options %+v", tc.name, o)
		}
	}
}
