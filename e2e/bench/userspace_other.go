//go:build !linux

package main

import (
	"context"
	"errors"
)

func runUserspace(context.Context, options) error {
	return errors.New("the userspace benchmark needs Linux")
}
