package proxy

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestServiceHealthKeepsAddressesItCannotRead: when the node's addresses cannot be read, the health check
// servers stay on the addresses they listen on (none is not what the node has); once they can be read,
// a change moves them.
func TestServiceHealthKeepsAddressesItCannotRead(t *testing.T) {
	sh := NewServiceHealth(v1.IPv4Protocol, func() Settings { return Settings{Family: v1.IPv4Protocol} }, nil, nil)
	var listened []string
	sh.listen = func(network, addr string) (net.Listener, error) {
		listened = append(listened, addr)
		return net.Listen(network, "127.0.0.1:0")
	}
	var addrs []netip.Addr
	var readErr error
	sh.addrs = func(*Snapshot) ([]netip.Addr, error) { return addrs, readErr }
	name := ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "lb"}, Protocol: v1.ProtocolTCP}
	snap := &Snapshot{Services: map[ServicePortName]*ServicePort{name: {Name: name, HealthCheckNodePort: 31000}}}
	t.Cleanup(func() { sh.Sync(&Snapshot{}) })

	addrs = []netip.Addr{netip.MustParseAddr("10.0.0.1")}
	sh.Sync(snap)
	addrs, readErr = nil, errors.New("reading the node's addresses: too many open files")
	sh.Sync(snap)
	if hc := sh.services[name.NamespacedName]; hc == nil || len(hc.servers) != 1 || !slices.Equal(hc.addrs, []netip.Addr{netip.MustParseAddr("10.0.0.1")}) {
		t.Errorf("after a failed read the server is %+v, want it still on 10.0.0.1", hc)
	}
	if want := []string{"10.0.0.1:31000"}; !slices.Equal(listened, want) {
		t.Errorf("listened on %v through a failed read, want %v and no reopening", listened, want)
	}
	addrs, readErr = []netip.Addr{netip.MustParseAddr("10.0.0.2")}, nil
	sh.Sync(snap)
	if want := []string{"10.0.0.1:31000", "10.0.0.2:31000"}; !slices.Equal(listened, want) {
		t.Errorf("listened on %v, want %v", listened, want)
	}
}
