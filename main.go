// Command kube-proxy is a drop-in reimplementation of Kubernetes' kube-proxy as a single-binary node daemon
// managed by systemd: it reads upstream's KubeProxyConfiguration, watches Services, EndpointSlices and its
// own Node, and programs the kernel (mode iptables, nftables or ipvs) or proxies itself (mode userspace) so
// that Service IPs and ports reach their endpoints.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	apiversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules"
	"kube-proxy/rules/inspect"
	"kube-proxy/systemd"
)

// Set with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "v0.0.0-dev"
	commit  = "unknown"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "reload" { // ExecReload= of the unit: signal and wait
		if err := systemd.ReloadCommand(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "kube-proxy reload:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) >= 2 && slices.Contains(inspect.Commands, os.Args[1]) { // operator commands: read-only
		os.Exit(inspect.Main(os.Args[1], os.Args[2:], os.Stdout, os.Stderr, "kube-proxy/"+version))
	}
	opts := config.NewOptions()
	fs, klogFlags := newFlagSet(opts)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == pflag.ErrHelp {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "kube-proxy:", err)
		os.Exit(2)
	}
	if print, raw := opts.Version.Print(); print {
		printVersion(os.Stdout, opts.Version.Release(), raw)
		os.Exit(0)
	}
	cfg, warnings, err := opts.Complete(fs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-proxy: invalid configuration:\n"+err.Error())
		os.Exit(1)
	}
	logs := systemd.NewLogging(klogFlags)
	if err := logs.Start(cfg.Logging, cfg.FeatureEnabled("ContextualLogging")); err != nil {
		fmt.Fprintln(os.Stderr, "kube-proxy: setting up logging:", err)
		os.Exit(1)
	}
	defer klog.Flush()
	proxy.LogConfigWarnings(warnings)
	if opts.WriteConfigTo != "" {
		b, err := config.Marshal(cfg)
		exitOn(err)
		exitOn(os.WriteFile(opts.WriteConfigTo, b, 0o644))
		os.Exit(0)
	}
	klog.InfoS("Starting kube-proxy", "version", version, "commit", commit, "config", opts.ConfigFile, "overriddenByFlags", opts.Overrides(fs))
	if version != "v0.0.0-dev" { // else the toolchain's VCS stamp says more (proxy.BuildInfo)
		proxy.SetBuildInfo(proxy.BuildInfo{Version: version, Commit: commit})
	}
	if opts.Cleanup {
		exitOn(rules.Cleanup(context.Background()))
		klog.InfoS("Cleanup done")
		os.Exit(0)
	}
	exitOn(run(opts, fs, cfg, logs))
}

// run starts the daemon and blocks until it is told to stop.
func run(opts *config.Options, fs *pflag.FlagSet, cfg *config.KubeProxyConfiguration, logs *systemd.Logging) error {
	// First, before any command runs: the listeners a previous process left in systemd's store.
	sockets := systemd.OpenFDStore()
	if err := systemd.SetOOMScoreAdj(cfg.OOMScoreAdj); err != nil {
		klog.ErrorS(err, "Continuing with the inherited OOM score")
	}
	nodeName, err := proxy.NodeName(cfg.HostnameOverride)
	if err != nil {
		return err
	}
	client, err := proxy.NewClient(cfg.ClientConnection, opts.Master, "kube-proxy/"+version)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	registry := prometheus.NewRegistry()
	mode, err := rules.New(ctx, cfg, nodeName, registry, sockets)
	if err != nil {
		return fmt.Errorf("setting up the %s dataplane: %w", cfg.Mode, err)
	}
	if opts.InitOnly {
		klog.InfoS("Initialization done (--init-only)")
		return nil
	}
	srv := proxy.NewServer(cfg, client, nodeName, registry, mode.Dataplanes)
	go func() { // other modes' rules go once ours are in place, so that Services keep working through a switch
		select {
		case <-srv.Proxy.Ready():
			mode.AfterReady(ctx)
		case <-ctx.Done():
		}
	}()
	srv.FlagOverrides = opts.Overrides(fs)
	srv.ModeDefaulted = opts.ModeDefaulted(fs)
	srv.Flags = fs
	srv.Release = opts.Version.Release()
	srv.Reloading = proxy.Reloading{Logs: logs, Load: func() (*config.KubeProxyConfiguration, []*config.FieldError, error) {
		return opts.Complete(fs) // the file again, with the same command line
	}}
	done, finished := make(chan error, 1), make(chan struct{})
	go func() { done <- srv.Run(ctx); close(finished) }()
	err = systemd.Run(ctx, systemd.NewNotifier(), systemd.Hooks{
		Ready:  srv.Proxy.Ready(),
		Alive:  srv.Proxy.LoopAlive,
		Status: srv.Status,
		Done:   done,
		Reload: srv.Reload,
	})
	cancel()
	select { // let servers and the sync loop wind down, within the 2 s a stop may take
	case <-finished:
	case <-time.After(1500 * time.Millisecond):
	}
	return err
}

// newFlagSet returns the command line's flags: opts' and klog's -v and --vmodule, which are also in the
// klog flag set returned, for systemd.Logging.
func newFlagSet(opts *config.Options) (*pflag.FlagSet, *flag.FlagSet) {
	fs := pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	// Of klog's flags only -v and --vmodule, as upstream v1.37: it rejects the others (--log_file,
	// --logtostderr, ...), and with the logger systemd.Logging sets up they would do nothing.
	for _, name := range []string{"v", "vmodule"} {
		fs.AddGoFlag(klogFlags.Lookup(name))
	}
	opts.AddFlags(fs)
	return fs, klogFlags
}

// printVersion writes what --version prints: upstream's line first ("Kubernetes v1.37.2", the release this
// kube-proxy stands in for, or --version=vX.Y.Z's), so that scripts parsing it keep working, then this
// build's version and commit. With raw (--version=raw) the first line is, as upstream's, the version
// information as a Go value: the release with this build's commit, tree state and toolchain.
func printVersion(w io.Writer, release string, raw bool) {
	if raw {
		fmt.Fprintf(w, "%#v\n", rawVersion(release))
	} else {
		fmt.Fprintf(w, "Kubernetes %s\n", release)
	}
	fmt.Fprintf(w, "kube-proxy %s (commit %s)\n", version, commit)
}

// rawVersion is what --version=raw prints first: upstream's version.Info for release, with this build's
// commit, tree state and toolchain.
func rawVersion(release string) apiversion.Info {
	v := utilversion.MustParseSemantic(release)
	b := proxy.BuildInfo{Version: version, Commit: commit}.Completed()
	return apiversion.Info{
		Major:        strconv.FormatUint(uint64(v.Major()), 10),
		Minor:        strconv.FormatUint(uint64(v.Minor()), 10),
		GitVersion:   release,
		GitCommit:    b.Commit,
		GitTreeState: b.TreeState,
		BuildDate:    b.BuildDate,
		GoVersion:    runtime.Version(),
		Compiler:     runtime.Compiler,
		Platform:     runtime.GOOS + "/" + runtime.GOARCH,
	}
}

func exitOn(err error) {
	if err != nil {
		klog.ErrorS(err, "kube-proxy failed")
		klog.Flush()
		os.Exit(1)
	}
}
