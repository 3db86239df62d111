package rules

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"kube-proxy/config"
	"kube-proxy/proxy"
)

// newUserspace sets up mode userspace (issue 13; config validation does not accept the mode yet).
func newUserspace(ctx context.Context, cfg *config.KubeProxyConfiguration, nodeName string, reg prometheus.Registerer) ([]proxy.FamilyDataplane, error) {
	return nil, fmt.Errorf("mode %q is not built yet", cfg.Mode)
}

// cleanupUserspace removes mode userspace's capture rules (none yet).
func cleanupUserspace(ctx context.Context) error { return nil }
