package proxy

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"kube-proxy/config"
)

// APIState is what the daemon watches, listed once: the objects and the snapshots a sync would take from
// them now. The operator commands (`kube-proxy diff`, `trace`) use it; the daemon does not.
type APIState struct {
	Services  []*v1.Service
	Slices    []*discovery.EndpointSlice
	Node      *v1.Node // nil when the node has no Node object
	Snapshots []*Snapshot
}

// ListAPIState lists the Services, EndpointSlices, Node and ServiceCIDRs with the selectors the daemon's
// watches use and builds the snapshots of families through the same Tracker.
func ListAPIState(ctx context.Context, client API, cfg *config.KubeProxyConfiguration, nodeName string, families []v1.IPFamily) (*APIState, error) {
	svcs, err := client.ListServices(ctx, "", metav1.ListOptions{LabelSelector: serviceSelector,
		FieldSelector: fields.OneTermNotEqualSelector("spec.clusterIP", v1.ClusterIPNone).String()})
	if err != nil {
		return nil, fmt.Errorf("listing Services: %w", err)
	}
	slices, err := client.ListEndpointSlices(ctx, "", metav1.ListOptions{LabelSelector: sliceSelector})
	if err != nil {
		return nil, fmt.Errorf("listing EndpointSlices: %w", err)
	}
	st := &APIState{}
	tr := NewTracker(TrackerOptions{NodeName: nodeName, Families: families, ExternalIPs: cfg.FeatureEnabled("AllowServiceExternalIPs")})
	for i := range svcs.Items {
		st.Services = append(st.Services, &svcs.Items[i])
	}
	for i := range slices.Items {
		st.Slices = append(st.Slices, &slices.Items[i])
	}
	tr.ReplaceServices(st.Services)
	tr.ReplaceEndpointSlices(st.Slices)
	node, err := client.GetNode(ctx, nodeName)
	if err == nil {
		st.Node = node
		tr.OnNode(node)
	}
	if cidrs, err := client.ListServiceCIDRs(ctx, metav1.ListOptions{}); err == nil {
		var all []string
		for _, sc := range cidrs.Items {
			all = append(all, sc.Spec.CIDRs...)
		}
		tr.OnServiceCIDRs(all)
	}
	st.Snapshots = tr.Snapshots().Snapshots
	return st, nil
}
