package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"kube-proxy/config"
	"kube-proxy/proxy"
)

// DefaultConfigFile is read when --config is not given and the file exists (the packaged unit's path).
const DefaultConfigFile = "/var/lib/kube-proxy/kube-proxy-config.yaml"

// Env is what the commands know of the node: its configuration and how to reach the API.
type Env struct {
	Config   *config.KubeProxyConfiguration
	NodeName string
	Master   string
	// UserAgent is sent to the API server.
	UserAgent string
	cached    proxy.API
}

func (e *Env) client() (proxy.API, error) {
	if e.cached != nil {
		return e.cached, nil
	}
	if e.Config.ClientConnection.Kubeconfig == "" && e.Master == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, errors.New("no kubeconfig in the configuration and no --kubeconfig or --master")
	}
	c, err := proxy.NewClient(e.Config.ClientConnection, e.Master, e.UserAgent)
	if err != nil {
		return nil, err
	}
	e.cached = c
	return c, nil
}

// Exit codes.
const (
	exitOK      = 0
	exitFinding = 1 // trace: no endpoint reached; diff: drift; doctor: a problem
	exitUsage   = 2
)

// Main runs `kube-proxy trace|diff|doctor ARGS` and returns the exit code.
func Main(cmd string, args []string, stdout, stderr io.Writer, userAgent string) int {
	fs := pflag.NewFlagSet("kube-proxy "+cmd, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := config.NewOptions()
	opts.AddFlags(fs)
	jsonOut := fs.Bool("json", false, "Print the result as JSON.")
	var to, from, in string
	var local bool
	if cmd == "trace" {
		fs.StringVar(&to, "to", "", "The destination: IP:PORT[/tcp|udp|sctp] (a ClusterIP, NodePort, externalIP, LoadBalancer IP or any address).")
		fs.StringVar(&from, "from", "", "The source address (default: 203.0.113.1 or 2001:db8::1, a client outside the cluster; with --local, the node's address).")
		fs.StringVar(&in, "in", "", "The interface the packet arrives on (default: the interface of the default route).")
		fs.BoolVar(&local, "local", false, "The packet is sent by the node itself (a process on the host network).")
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: kube-proxy %s %s\n\n%s\nFlags (the daemon's flags are accepted too; --config defaults to %s when it exists):\n",
			cmd, usageArgs[cmd], usageText[cmd], DefaultConfigFile)
		fmt.Fprint(stderr, ownFlags(fs, cmd))
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintln(stderr, "kube-proxy "+cmd+":", err)
		return exitUsage
	}
	if !fs.Changed("config") {
		if _, err := os.Stat(DefaultConfigFile); err == nil {
			opts.ConfigFile = DefaultConfigFile
		}
	}
	cfg, _, err := opts.Complete(fs)
	if err != nil {
		fmt.Fprintln(stderr, "kube-proxy "+cmd+": invalid configuration:\n"+err.Error())
		return exitUsage
	}
	nodeName, err := proxy.NodeName(cfg.HostnameOverride)
	if err != nil {
		fmt.Fprintln(stderr, "kube-proxy "+cmd+":", err)
		return exitUsage
	}
	env := &Env{Config: cfg, NodeName: nodeName, Master: opts.Master, UserAgent: userAgent}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := &printer{w: stdout, json: *jsonOut}
	switch cmd {
	case "trace":
		return runTrace(ctx, env, fs.Args(), to, from, in, local, out, stderr)
	case "diff":
		if fs.NArg() > 0 {
			fmt.Fprintln(stderr, "kube-proxy diff: unexpected arguments:", strings.Join(fs.Args(), " "))
			return exitUsage
		}
		return runDiff(ctx, env, out, stderr)
	case "doctor":
		if fs.NArg() > 0 {
			fmt.Fprintln(stderr, "kube-proxy doctor: unexpected arguments:", strings.Join(fs.Args(), " "))
			return exitUsage
		}
		return runDoctor(ctx, env, out, stderr)
	}
	fmt.Fprintln(stderr, "kube-proxy: unknown command", cmd)
	return exitUsage
}

// Commands are the operator commands Main runs.
var Commands = []string{"trace", "diff", "doctor"}

var usageArgs = map[string]string{
	"trace":  "NAMESPACE/SERVICE[:PORT] | --to IP:PORT[/PROTO] [--from IP] [--in IFACE | --local] [--json]",
	"diff":   "[--config FILE] [--json]",
	"doctor": "[--config FILE] [--json]",
}

var usageText = map[string]string{
	"trace": "Walks the first packet of a connection through the kernel's live kube-proxy rules (iptables, either\n" +
		"backend, or nftables) and says where it goes: the endpoints it can reach with their probability and\n" +
		"whether it is masqueraded, or why it is dropped. With the API reachable it adds the API's view.\n" +
		"Exit 0 when the packet reaches an endpoint, 1 when it does not, 2 on a usage error.\n",
	"diff": "Renders what kube-proxy would write for the API's current state, with the daemon's own code, and\n" +
		"compares it with the kernel's rules: missing, stale and foreign rules, chains, set elements, per Service.\n" +
		"Read-only. Exit 0 when they agree, 1 on drift, 2 on a usage error.\n",
	"doctor": "Checks the node's prerequisites and known-bad states (iptables backends, foreign rules ahead of ours,\n" +
		"kernel modules, sysctls, conntrack, the daemon's health and syncs, the API server and RBAC), each finding\n" +
		"with why it matters and the command that fixes it. Exit 0 when nothing is wrong, 1 when something is.\n",
}

// ownFlags prints the command's own flags and the common ones (not every daemon flag).
func ownFlags(fs *pflag.FlagSet, cmd string) string {
	keep := map[string]bool{"json": true, "config": true, "kubeconfig": true, "master": true, "hostname-override": true}
	if cmd == "trace" {
		for _, n := range []string{"to", "from", "in", "local"} {
			keep[n] = true
		}
	}
	sub := pflag.NewFlagSet("", pflag.ContinueOnError)
	fs.VisitAll(func(f *pflag.Flag) {
		if keep[f.Name] {
			sub.AddFlag(f)
		}
	})
	return sub.FlagUsages()
}

type printer struct {
	w    io.Writer
	json bool
}

func (p *printer) printf(format string, a ...any) {
	if !p.json {
		fmt.Fprintf(p.w, format, a...)
	}
}

func (p *printer) emit(v any) {
	if p.json {
		enc := json.NewEncoder(p.w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
	}
}
