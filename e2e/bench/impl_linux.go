package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"kube-proxy/e2e/harness"
)

// configExtra is what the benchmark's config file adds to harness.ConfigYAML (which sets the kubeconfig, the
// node name, healthz and metrics on 127.0.0.1 and conntrack settings that leave global sysctls alone), in
// proxy mode proxy (every setting of that mode's section at its default).
func configExtra(proxy string, profiling bool) string {
	s := "mode: " + proxy + "\nclusterCIDR: " + harness.PodCIDR + "\n"
	if profiling {
		s += "enableProfiling: true\n"
	}
	return s
}

// flagArgs are the command-line equivalent of the config file, with minSyncPeriod 0 (in mode nftables
// too, --iptables-min-sync-period sets it: upstream has no nftables flags).
func flagArgs(proxy, kubeconfig string, profiling bool) []string {
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--hostname-override=" + nodeName,
		"--proxy-mode=" + proxy,
		"--cluster-cidr=" + harness.PodCIDR,
		"--healthz-bind-address=127.0.0.1:10256",
		"--metrics-bind-address=127.0.0.1:10249",
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--iptables-min-sync-period=0",
	}
	if profiling {
		args = append(args, "--profiling")
	}
	return args
}

// daemon is one implementation running in a node namespace.
type daemon struct {
	impl  string
	proc  *harness.Process
	start time.Time // just before exec
	ns    *harness.NetNS
}

// launch starts impl (binary bin) in ns in proxy mode proxy, configured as mode says, logging into dir.
func launch(impl, bin, proxy, mode string, ns *harness.NetNS, kubeconfig, dir string, env []string, profiling bool) (*daemon, error) {
	var args []string
	switch mode {
	case modeConfig:
		path := filepath.Join(dir, impl+"-config.yaml")
		if err := os.WriteFile(path, []byte(harness.ConfigYAML(kubeconfig, nodeName, configExtra(proxy, profiling))), 0o644); err != nil {
			return nil, err
		}
		args = []string{"--config=" + path}
	case modeFlags:
		args = flagArgs(proxy, kubeconfig, profiling)
	default:
		return nil, fmt.Errorf("unknown mode %q", mode)
	}
	args = append(args, "--v=2")
	cmd := ns.Command(context.Background(), bin, args...)
	cmd.Env = append(os.Environ(), env...)
	if impl == implOurs {
		rt := filepath.Join(dir, "run-"+mode)
		if err := os.MkdirAll(rt, 0o755); err != nil {
			return nil, err
		}
		cmd.Env = append(cmd.Env, "RUNTIME_DIRECTORY="+rt)
	}
	d := &daemon{impl: impl, ns: ns, start: time.Now()}
	proc, err := harness.StartProcess(impl+" kube-proxy", cmd, filepath.Join(dir, impl+"-"+mode+".log"))
	if err != nil {
		return nil, err
	}
	d.proc = proc
	return d, nil
}

// stop ends the daemon: SIGTERM, then SIGKILL after 10 s.
func (d *daemon) stop() {
	if d != nil && d.proc != nil {
		_ = d.proc.Stop(syscall.SIGTERM, 10*time.Second)
	}
}

// alive returns an error with the log's tail if the daemon has exited.
func (d *daemon) alive() error {
	if d.proc.Exited() {
		return fmt.Errorf("%s kube-proxy exited: %v\n%s", d.impl, d.proc.ExitErr(), d.proc.LogTail(30))
	}
	return nil
}

// fetchProfile fetches a CPU profile of seconds from the daemon's /debug/pprof (enableProfiling) into path.
// It retries until the metrics server answers, for at most 30 s.
func (d *daemon) fetchProfile(ctx context.Context, seconds int, path string) error {
	return d.fetchPprof(ctx, fmt.Sprintf("profile?seconds=%d", seconds), time.Duration(seconds)*time.Second, path)
}

// fetchPprof fetches /debug/pprof/<what> from the daemon into path, allowing it to take d plus a minute.
func (d *daemon) fetchPprof(ctx context.Context, what string, dur time.Duration, path string) error {
	client := d.ns.HTTPClient()
	client.Timeout = dur + time.Minute
	url := "http://127.0.0.1:10249/debug/pprof/" + what
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				return fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
			}
			f, err := os.Create(path)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, resp.Body); err != nil {
				f.Close()
				return fmt.Errorf("reading profile: %w", err)
			}
			return f.Close()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("GET %s: %w", url, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
