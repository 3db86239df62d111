//go:build !linux

package ipvs

import (
	"context"
	"errors"

	"kube-proxy/rules/xtables"
)

var errNotLinux = errors.New("IPVS mode needs Linux")

// New fails: IPVS mode needs Linux.
func New(ctx context.Context, cfg Config, runner *xtables.Runner, cl cleaner, m *Metrics, opts ...Option) (*Dataplane, error) {
	return nil, errNotLinux
}

// Usable fails: IPVS mode needs Linux.
func Usable(scheduler string) error { return errNotLinux }

// Cleanup has nothing to clean up outside Linux.
func Cleanup(ctx context.Context) error { return nil }
