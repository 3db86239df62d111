package proxy

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/prometheus/slis"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy/zpages"
)

// component is the name upstream's status pages give kube-proxy.
const component = "kube-proxy"

// metricsHandler serves what upstream's metrics port serves: /metrics, /metrics/slis, /healthz (and
// /healthz/ping), /proxyMode, /configz, /flagz and /statusz (unless their feature gates are off), and
// /debug/pprof when enableProfiling is set.
func (s *Server) metricsHandler() http.Handler {
	cfg := s.Config()
	mux := http.NewServeMux()
	var paths []string // what /statusz lists: the paths installed before it, as upstream's
	handle := func(path string, h http.Handler) {
		mux.Handle(path, h)
		paths = append(paths, path)
	}
	handle("/healthz", http.HandlerFunc(pingHealthz))
	handle("/healthz/ping", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprint(w, "ok") }))
	handle("/metrics/slis", s.slisHandler())
	handle("/proxyMode", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprint(w, s.Config().EffectiveMode())
	}))
	handle("/metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{Registry: s.Registry}))
	if cfg.EnableProfiling {
		handle("/debug/pprof/", http.HandlerFunc(pprof.Index))
		handle("/debug/pprof/cmdline", http.HandlerFunc(pprof.Cmdline))
		handle("/debug/pprof/profile", http.HandlerFunc(pprof.Profile))
		handle("/debug/pprof/symbol", http.HandlerFunc(pprof.Symbol))
		handle("/debug/pprof/trace", http.HandlerFunc(pprof.Trace))
	}
	handle("/configz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"kubeproxy.config.k8s.io": s.Config()})
	}))
	if s.Flags != nil && cfg.FeatureEnabled("ComponentFlagz") {
		handle("/flagz", zpages.FlagzHandler(component, func() map[string]string { return flagValues(s.Flags) }))
	}
	if cfg.FeatureEnabled("ComponentStatusz") {
		mux.Handle("/statusz", zpages.StatuszHandler(component, zpages.Status{
			Start:            processStart(),
			BinaryVersion:    strings.TrimPrefix(cmp.Or(s.Release, config.UpstreamRelease), "v"),
			EmulationVersion: config.UpstreamVersion,
			GoVersion:        runtime.Version(),
			Paths:            slices.Clone(paths),
		}, time.Now))
	}
	return mux
}

// pingHealthz is the /healthz of upstream's metrics port: the API server's health handler with its one
// check, ping, whose results /metrics/slis counts. ?verbose lists the checks; ?exclude=ping skips it.
func pingHealthz(w http.ResponseWriter, r *http.Request) {
	var out strings.Builder
	excluded := r.URL.Query()["exclude"]
	if slices.Contains(excluded, "ping") {
		out.WriteString("[+]ping excluded: ok\n")
	} else {
		_ = slis.ObserveHealthcheck(context.Background(), "ping", "healthz", slis.Success)
		out.WriteString("[+]ping ok\n")
	}
	var unknown []string
	for _, e := range excluded {
		if e != "ping" && !slices.Contains(unknown, fmt.Sprintf("%q", e)) {
			unknown = append(unknown, fmt.Sprintf("%q", e))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		fmt.Fprintf(&out, "warn: some health checks cannot be excluded: no matches for %s\n", strings.Join(unknown, ","))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if _, verbose := r.URL.Query()["verbose"]; !verbose {
		_, _ = fmt.Fprint(w, "ok")
		return
	}
	_, _ = fmt.Fprint(w, out.String()+"healthz check passed\n")
}

// slisHandler serves /metrics/slis: component-base's health-check SLI metrics (kubernetes_healthcheck,
// kubernetes_healthchecks_total) and process_start_time_seconds, on a registry of the Server's own; a
// DELETE resets them, as upstream's.
func (s *Server) slisHandler() http.Handler {
	reg := compbasemetrics.NewKubeRegistry()
	slis.Register(reg)
	return compbasemetrics.HandlerWithReset(reg, compbasemetrics.HandlerOpts{})
}

// flagValues is every flag of fs, hidden and deprecated ones too, with its value, as upstream's /flagz
// reads its flag set.
func flagValues(fs *pflag.FlagSet) map[string]string {
	out := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) { out[f.Name] = f.Value.String() })
	return out
}

// processStart is when this process started, as upstream's /statusz reads it (the kernel's record, to the
// second); now when that cannot be read.
func processStart() time.Time {
	start, err := compbasemetrics.GetProcessStart()
	if err != nil {
		klog.ErrorS(err, "Reading the process start time for /statusz")
		return time.Now()
	}
	return time.Unix(int64(start), 0)
}
