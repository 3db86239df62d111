//go:build !linux

package xtables

import (
	"errors"

	v1 "k8s.io/api/core/v1"
)

// nftChains needs nfnetlink: Linux only.
func nftChains(v1.IPFamily, string) ([]string, error) {
	return nil, errors.New("listing nf_tables chains needs Linux")
}
