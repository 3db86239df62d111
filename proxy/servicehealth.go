package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// ServiceHealth runs the health-check node port servers of one IP family: for every LoadBalancer Service
// with externalTrafficPolicy Local, an HTTP server on its healthCheckNodePort that tells the cloud load
// balancer whether this node has local endpoints (200) or not (503), with upstream's JSON body and headers.
type ServiceHealth struct {
	family  v1.IPFamily
	network string
	// addrs returns the addresses to listen on for a snapshot (unspecified address = all).
	addrs  func(*Snapshot) ([]netip.Addr, error)
	health *Health
	listen func(network, addr string) (net.Listener, error)
	// listenFailed (nil: no one) is told the first time a Service's server cannot listen on a port (again
	// after it listened, its port changed or it went away): the Server records upstream's Event.
	listenFailed func(nn types.NamespacedName, port int32, err error)

	mu       sync.RWMutex
	listened []netip.Addr // the addresses of the last Sync
	services map[types.NamespacedName]*hcServer
	failing  map[types.NamespacedName]int32 // the port each Service's server last failed to listen on
}

type hcServer struct {
	port      int32
	addrs     []netip.Addr
	servers   []*http.Server
	endpoints int
}

// NewServiceHealth returns the health-check servers of family, listening on the addresses that the
// NodePort addresses of settings (read at each sync, so reloads apply) allow. listenFailed (nil: none) is
// told when a Service's server cannot listen, once until it does.
func NewServiceHealth(family v1.IPFamily, settings func() Settings, health *Health,
	listenFailed func(nn types.NamespacedName, port int32, err error)) *ServiceHealth {
	network, unspecified := "tcp4", netip.IPv4Unspecified()
	if family == v1.IPv6Protocol {
		network, unspecified = "tcp6", netip.IPv6Unspecified()
	}
	addrs := func(snap *Snapshot) ([]netip.Addr, error) {
		st := settings()
		addrs, all, err := st.NodePortIPs(&snap.Node, InterfaceAddrs)
		if all {
			return []netip.Addr{unspecified}, nil
		}
		return addrs, err
	}
	return &ServiceHealth{family: family, network: network, addrs: addrs, health: health,
		listen: net.Listen, listenFailed: listenFailed, services: map[types.NamespacedName]*hcServer{}, failing: map[types.NamespacedName]int32{}}
}

// Sync opens and closes servers to match the snapshot and updates their local endpoint counts: the number
// of distinct IPs of this node's ready endpoints of the Service.
func (s *ServiceHealth) Sync(snap *Snapshot) {
	ports := map[types.NamespacedName]int32{}
	local := map[types.NamespacedName]map[netip.Addr]struct{}{}
	for _, sp := range snap.Services {
		if sp.HealthCheckNodePort == 0 {
			continue
		}
		nn := sp.Name.NamespacedName
		ports[nn] = sp.HealthCheckNodePort
		for _, e := range sp.Endpoints {
			if e.IsLocal && e.Ready {
				if local[nn] == nil {
					local[nn] = map[netip.Addr]struct{}{}
				}
				local[nn][e.IP] = struct{}{}
			}
		}
	}
	addrs, err := s.addrs(snap)

	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		// Not "no addresses": the servers stay where they listen.
		klog.ErrorS(err, "Keeping the health check servers on the addresses they listen on", "ipFamily", s.family)
		addrs = s.listened
	}
	s.listened = addrs
	for nn, hc := range s.services {
		if port, ok := ports[nn]; !ok || port != hc.port || !slices.Equal(addrs, hc.addrs) {
			klog.V(2).InfoS("Closing health check server", "service", nn, "port", hc.port)
			hc.close()
			delete(s.services, nn)
		}
	}
	for nn := range s.failing {
		if _, ok := ports[nn]; !ok {
			delete(s.failing, nn)
		}
	}
	for nn, port := range ports {
		hc := s.services[nn]
		if hc == nil {
			var err error
			if hc, err = s.open(nn, port, addrs); err != nil {
				klog.ErrorS(err, "Failed to start health check server", "service", nn, "port", port)
				if s.failing[nn] != port && s.listenFailed != nil {
					s.listenFailed(nn, port, err)
				}
				s.failing[nn] = port
				continue
			}
			delete(s.failing, nn)
			klog.V(2).InfoS("Opened health check server", "service", nn, "port", port, "ipFamily", s.family)
			s.services[nn] = hc
		}
		hc.endpoints = len(local[nn])
	}
}

func (s *ServiceHealth) open(nn types.NamespacedName, port int32, addrs []netip.Addr) (*hcServer, error) {
	hc := &hcServer{port: port, addrs: addrs}
	for _, a := range addrs {
		ln, err := s.listen(s.network, netip.AddrPortFrom(a, uint16(port)).String())
		if err != nil {
			hc.close()
			return nil, fmt.Errorf("listening on %s port %d: %w", a, port, err)
		}
		srv := &http.Server{Handler: s.handler(nn), ReadHeaderTimeout: 10 * time.Second}
		hc.servers = append(hc.servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "Health check server stopped", "service", nn)
			}
		}()
	}
	return hc, nil
}

func (hc *hcServer) close() {
	for _, srv := range hc.servers {
		_ = srv.Close()
	}
}

// Close stops every server.
func (s *ServiceHealth) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for nn, hc := range s.services {
		hc.close()
		delete(s.services, nn)
	}
}

// Shutdown closes every server when ctx is done.
func (s *ServiceHealth) Shutdown(ctx context.Context) {
	<-ctx.Done()
	s.Close()
}

func (s *ServiceHealth) handler(nn types.NamespacedName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.RLock()
		hc, ok := s.services[nn]
		count := 0
		if ok {
			count = hc.endpoints
		}
		s.mu.RUnlock()
		healthy := s.health.Status().Healthy
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
		if count > 0 && healthy {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = fmt.Fprintf(w, "{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
			nn.Namespace, nn.Name, count, healthy)
	})
}
