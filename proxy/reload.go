package proxy

import (
	"context"
	"strings"

	"k8s.io/klog/v2"

	"kube-proxy/config"
)

// Reloading is what a reload reads and sets besides the sync loop and the dataplanes: the configuration
// as the file and the command line give it now, and the logging.
type Reloading struct {
	// Load reads the configuration again, with what it sets that loads but does nothing or is going away.
	Load func() (*config.KubeProxyConfiguration, []*config.FieldError, error)
	// Logs puts the logging settings in force.
	Logs LogSettings
}

// LogSettings are the logging settings a reload may change live (systemd.Logging).
type LogSettings interface {
	// SetVerbosity sets the log verbosity.
	SetVerbosity(v int) error
	// Apply puts the other live logging fields in force (vmodule, flushFrequency).
	Apply(c config.LoggingConfiguration) error
}

// Reload loads the configuration again and applies it: fields that can change live are put in force (sync
// periods, logging, dataplane settings, confirmed by a full sync) and the call returns once they are. A
// load error, or a change to a field that needs a restart, keeps the running configuration entirely.
// s.Reloading says where the configuration and the logging come from.
func (s *Server) Reload(ctx context.Context) config.ReloadResult {
	next, warnings, loadErr := s.Reloading.Load()
	LogConfigWarnings(warnings)
	res := s.reload(ctx, next, loadErr)
	if res.Result != config.ReloadApplied {
		return res
	}
	// reload put the verbosity in force; vmodule and flushFrequency, the other live logging fields, are
	// put in force here, before the reply. A change of format or output options never gets here:
	// config.ReloadPlan makes it restart-required.
	if err := s.Reloading.Logs.Apply(next.Logging); err != nil {
		klog.ErrorS(err, "Reloaded, except for the logging settings")
		res.Message += "; except the logging settings: " + err.Error()
	}
	if len(warnings) > 0 {
		res.Message += "; " + warningsText(warnings)
	}
	return res
}

// reload applies next (or refuses it, or reports loadErr): the sync periods, the verbosity and the
// dataplanes' settings, all or none.
func (s *Server) reload(ctx context.Context, next *config.KubeProxyConfiguration, loadErr error) config.ReloadResult {
	s.mu.Lock()
	s.reloads++
	res := config.ReloadResult{Generation: s.reloads}
	cur := s.cfg
	s.mu.Unlock()
	fail := func(result, msg string) config.ReloadResult {
		res.Result, res.Message = result, msg
		s.Proxy.Metrics().ConfigReloads.WithLabelValues(result).Inc()
		klog.ErrorS(nil, "Configuration reload refused; the running configuration stays in force", "result", result, "reason", msg)
		return res
	}
	if loadErr != nil {
		return fail(config.ReloadInvalid, loadErr.Error())
	}
	live, restart := config.ReloadPlan(cur, next)
	if len(restart) > 0 {
		return fail(config.ReloadRestartRequired, "changed fields need a restart: "+strings.Join(restart, ", "))
	}
	logs := s.Reloading.Logs
	if err := logs.SetVerbosity(int(next.Logging.Verbosity)); err != nil {
		return fail(config.ReloadInvalid, err.Error())
	}
	syncPeriod, minSyncPeriod := next.SyncPeriods()
	s.Proxy.SetSyncPeriods(syncPeriod, minSyncPeriod)
	err := s.Proxy.Reconfigure(ctx, next, cur)
	if IsRefused(err) {
		// The dataplanes keep what they had; so do the sync loop and the log.
		_ = logs.SetVerbosity(int(cur.Logging.Verbosity))
		s.Proxy.SetSyncPeriods(cur.SyncPeriods())
		return fail(config.ReloadInvalid, err.Error())
	}
	s.mu.Lock()
	s.cfg = next
	s.mu.Unlock()
	res.Result = config.ReloadApplied
	res.Message = "changed: " + strings.Join(live, ", ")
	if len(live) == 0 {
		res.Message = "no changes"
	}
	if err != nil {
		// In force, but not in the kernel yet: the sync is retried like any failed one, and /healthz
		// tells when it keeps failing.
		res.Message += "; the sync that applies it failed and is retried: " + err.Error()
		klog.ErrorS(err, "Configuration reloaded, but the sync that applies it failed; retrying", "generation", res.Generation)
	}
	if len(s.FlagOverrides) > 0 {
		// A flag on the command line beats the file, at start and on every reload alike.
		res.Message += "; set by command-line flags, so not read from the file: " + strings.Join(s.FlagOverrides, ", ")
	}
	s.Proxy.Metrics().ConfigReloads.WithLabelValues(res.Result).Inc()
	klog.InfoS("Configuration reloaded", "generation", res.Generation, "changed", live)
	return res
}

// LogConfigWarnings logs what the configuration sets that loads but does nothing or will stop working:
// fields of older releases, GA or deprecated feature gates.
func LogConfigWarnings(warnings []*config.FieldError) {
	for _, w := range warnings {
		klog.InfoS("Warning: configuration setting ignored or going away", "warning", w.Error())
	}
}

// warningsText is the warnings on one line, for a reload's reply.
func warningsText(warnings []*config.FieldError) string {
	parts := make([]string, len(warnings))
	for i, w := range warnings {
		parts[i] = w.Error()
	}
	return "warnings: " + strings.Join(parts, "; ")
}
