//go:build !linux

package ipvs

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
)

var errNotLinux = errors.New("IPVS mode needs Linux")

// New fails: IPVS mode needs Linux.
func New(ctx context.Context, cfg *config.KubeProxyConfiguration, family v1.IPFamily, nodeName string, reg prometheus.Registerer, opts ...Option) (*Dataplane, error) {
	return nil, errNotLinux
}

// Usable fails: IPVS mode needs Linux.
func Usable(scheduler string) error { return errNotLinux }

// Cleanup has nothing to clean up outside Linux.
func Cleanup(ctx context.Context) error { return nil }
