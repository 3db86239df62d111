//go:build !linux

package main

import (
	"context"
	"errors"
)

func run(context.Context, options) error {
	return errors.New("the benchmark needs Linux (network namespaces, nf_tables)")
}
