package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy/events"
)

// Server is the running daemon without its process plumbing: the configuration in force, the Proxy, and the
// health and metrics HTTP servers. main builds it; systemd.Run drives its lifecycle.
type Server struct {
	NodeName string
	Registry *prometheus.Registry
	Proxy    *Proxy
	// FlagOverrides are the config fields the command line sets (they win over the file on reloads too).
	FlagOverrides []string
	// ModeDefaulted says that neither the file nor the command line chose the mode (see
	// config.Options.ModeDefaulted): Run then warns, as upstream, that the default changes in 1.40.
	ModeDefaulted bool
	// Flags is the command line, which /flagz shows; nil leaves /flagz out.
	Flags *pflag.FlagSet
	// Reloading is where Reload reads the configuration again and sets the logging.
	Reloading Reloading
	// Release is the Kubernetes version /statusz reports (--version=vX.Y.Z); empty: config.UpstreamRelease.
	Release string

	client        API
	events        *events.Recorder
	serviceHealth []*ServiceHealth
	// listenRetry is how long a server whose port is busy waits before it tries again.
	listenRetry time.Duration

	mu      sync.Mutex
	cfg     *config.KubeProxyConfiguration
	reloads uint64
}

// NewServer creates the Proxy for cfg with the given dataplanes and a fresh metrics registry (with Go and
// process collectors). Dataplanes may register their own metrics on Registry before Run.
func NewServer(cfg *config.KubeProxyConfiguration, client API, nodeName string,
	registry *prometheus.Registry, dataplanes []FamilyDataplane) *Server {
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerProcessMetrics(registry)    // client-go's rest_client_* and kubernetes_build_info, as upstream
	RegisterFeatureGates(registry, cfg) // kubernetes_feature_enabled, in every mode, as upstream
	syncPeriod, minSyncPeriod := cfg.SyncPeriods()
	hostname, _ := os.Hostname() // the Events' reportingInstance, as upstream's
	s := &Server{NodeName: nodeName, Registry: registry, client: client, cfg: cfg, listenRetry: 5 * time.Second,
		events: events.NewRecorder(client, hostname)}
	byFamily := map[v1.IPFamily]*ServiceHealth{}
	s.Proxy = New(Options{
		NodeName:      nodeName,
		Dataplanes:    dataplanes,
		SyncPeriod:    syncPeriod,
		MinSyncPeriod: minSyncPeriod,
		ExternalIPs:   cfg.FeatureEnabled("AllowServiceExternalIPs"),
		Registry:      registry,
		OnApplied:     func(snap *Snapshot) { byFamily[snap.Family].Sync(snap) },
	})
	for _, d := range dataplanes {
		family := d.Family
		sh := NewServiceHealth(family, func() Settings {
			st, err := SettingsFor(s.Config(), family)
			if err != nil { // a validated configuration always has settings
				klog.ErrorS(err, "Health-check node ports listen everywhere", "ipFamily", family)
			}
			return st
		}, s.Proxy.Health(), s.serviceHealthFailed)
		byFamily[d.Family] = sh
		s.serviceHealth = append(s.serviceHealth, sh)
	}
	return s
}

// Config returns the configuration in force.
func (s *Server) Config() *config.KubeProxyConfiguration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// Run serves /healthz, /livez and /metrics, watches the API and syncs until ctx is done. It returns early
// only when a server cannot listen and bindAddressHardFail is set. On the way it records upstream's Events
// about the node: the warnings about the mode, Starting, and a server's failure to listen; those not yet
// written when it returns get one last try, for up to a second.
func (s *Server) Run(ctx context.Context) error {
	cfg := s.Config()
	s.events.Start()
	defer s.events.Shutdown(time.Second)
	node := events.NodeRef(s.NodeName)
	for _, w := range events.StartWarnings(cfg.Mode, s.ModeDefaulted) {
		klog.ErrorS(nil, w.Note)
		s.events.Event(node, v1.EventTypeWarning, w.Reason, events.ActionStart, w.Note)
	}
	for _, sh := range s.serviceHealth {
		go sh.Shutdown(ctx)
	}
	serveErr := make(chan error, 2)
	s.serve(ctx, "healthz", cfg.HealthzBindAddress, s.Proxy.Health().Handler(), cfg.BindAddressHardFail, serveErr)
	s.serve(ctx, "metrics", cfg.MetricsBindAddress, s.metricsHandler(), cfg.BindAddressHardFail, serveErr)

	synced := make(chan error, 1)
	go func() { synced <- s.Proxy.WatchAPI(ctx, s.client, cfg.ConfigSyncPeriod.Duration) }()
	s.events.Event(node, v1.EventTypeNormal, events.ReasonStarting, events.ActionStart, "")
	select {
	case err := <-serveErr:
		return s.serverFailed(node, err)
	case err := <-synced:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		return nil
	}
	loopDone := make(chan struct{})
	go func() { s.Proxy.Loop(ctx); close(loopDone) }()
	select {
	case err := <-serveErr: // the caller cancels ctx, which ends the loop
		return s.serverFailed(node, err)
	case <-loopDone:
		return nil
	}
}

// listenError is a server's failure to listen.
type listenError struct {
	server string // "healthz" or "metrics"
	err    error
}

func (e *listenError) Error() string { return e.server + " server: " + e.err.Error() }
func (e *listenError) Unwrap() error { return e.err }

// failedServerReasons are the reasons of upstream's Events about a server that cannot listen.
var failedServerReasons = map[string]string{
	"healthz": events.ReasonFailedHealthServer,
	"metrics": events.ReasonFailedMetricsServer,
}

// serviceHealthFailed records upstream's Warning event about a Service whose health-check node port
// server cannot listen (the port is taken, say): a cloud load balancer probing it takes the node out.
func (s *Server) serviceHealthFailed(nn types.NamespacedName, port int32, err error) {
	s.events.Event(events.ServiceRef(nn), v1.EventTypeWarning, events.ReasonFailedServiceHealthcheck, events.ActionListen,
		fmt.Sprintf("node %s failed to start healthcheck %q on port %d: %v", s.NodeName, nn.String(), port, err))
}

// serverFailed records the Warning event of a server that could not listen and returns err.
func (s *Server) serverFailed(node v1.ObjectReference, err error) error {
	var le *listenError
	if errors.As(err, &le) {
		s.events.Event(node, v1.EventTypeWarning, failedServerReasons[le.server], events.ActionStart, err.Error())
	}
	return err
}

// serve listens on addr (host:port; an empty addr or port 0 disables the server) and serves h until ctx is
// done. While the port is busy (the proxy this one replaces may still be exiting) it tries again every
// listenRetry, as upstream does; with hardFail the first failure is sent to errs instead.
func (s *Server) serve(ctx context.Context, name, addr string, h http.Handler, hardFail bool, errs chan<- error) {
	if addr == "" || strings.HasSuffix(addr, ":0") {
		klog.InfoS("Server disabled", "server", name)
		return
	}
	go func() {
		var ln net.Listener
		for {
			var err error
			if ln, err = net.Listen("tcp", addr); err == nil {
				break
			}
			err = &listenError{server: name, err: err}
			if hardFail {
				errs <- err
				return
			}
			klog.ErrorS(err, "Cannot listen; trying again (bindAddressHardFail is false)", "server", name, "retryIn", s.listenRetry)
			select {
			case <-ctx.Done():
				return
			case <-time.After(s.listenRetry):
			}
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			<-ctx.Done()
			shutdownCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = srv.Shutdown(shutdownCtx)
		}()
		klog.InfoS("Serving", "server", name, "address", ln.Addr().String())
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "Server stopped", "server", name)
		}
	}()
}

// Status is a one-line summary for `systemctl status`.
func (s *Server) Status() string {
	cfg := s.Config()
	mode := string(cfg.EffectiveMode())
	var parts []string
	for _, d := range s.Proxy.opts.Dataplanes {
		if snap := s.Proxy.LastApplied(d.Family); snap != nil {
			parts = append(parts, fmt.Sprintf("%d %s service ports", len(snap.Services), d.Family))
		}
	}
	line := fmt.Sprintf("Proxying %s (mode %s, node %s)", strings.Join(parts, ", "), mode, s.NodeName)
	if len(parts) == 0 {
		line = fmt.Sprintf("Starting (mode %s, node %s)", mode, s.NodeName)
	}
	if n, since, err := s.Proxy.SyncFailures(); n > 0 {
		line += fmt.Sprintf("; sync failing (%d in a row since %s): %s", n, since.UTC().Format(time.TimeOnly), statusError(err))
	}
	return line
}

// statusError is err on one line, cut to what a STATUS line shows (systemctl status prints it whole).
func statusError(err error) string {
	msg := strings.Join(strings.Fields(fmt.Sprint(err)), " ")
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	return msg
}
