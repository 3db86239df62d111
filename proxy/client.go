package proxy

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"kube-proxy/config"
)

// NewClient builds the API client from clientConnection (and the --master override, which may be empty):
// the kubeconfig file when one is named, otherwise the in-cluster service account (as in a DaemonSet).
// Its requests are counted in the rest_client_* metrics that NewServer registers.
func NewClient(cc config.ClientConnectionConfiguration, master, userAgent string) (API, error) {
	installClientGoMetrics() // before the first transport is made, so that it is counted
	var rc *rest.Config
	var err error
	switch {
	case cc.Kubeconfig == "" && master == "":
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no clientConnection.kubeconfig set and not running in a cluster: %w", err)
		}
	default:
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: cc.Kubeconfig},
			&clientcmd.ConfigOverrides{ClusterInfo: clientcmdClusterServer(master)}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %q: %w", cc.Kubeconfig, err)
		}
	}
	rc.UserAgent = userAgent
	rc.AcceptContentTypes = cc.AcceptContentTypes
	rc.ContentType = cc.ContentType
	rc.QPS = cc.QPS
	rc.Burst = int(cc.Burst)
	client, err := newRESTAPI(rc)
	if err != nil {
		return nil, fmt.Errorf("creating API client: %w", err)
	}
	return client, nil
}

// NodeName returns the name of this node's Node object: hostnameOverride, or the lower-cased hostname.
func NodeName(hostnameOverride string) (string, error) {
	if n := strings.TrimSpace(hostnameOverride); n != "" {
		return strings.ToLower(n), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("reading the hostname (set hostnameOverride): %w", err)
	}
	return strings.ToLower(strings.TrimSpace(h)), nil
}

func clientcmdClusterServer(master string) clientcmdapi.Cluster {
	return clientcmdapi.Cluster{Server: master}
}
