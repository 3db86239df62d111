//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	ipvslib "github.com/cloudflare/ipvs"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/e2e/ipvsvm"
	"kube-proxy/proxy"
	"kube-proxy/rules/ipvs"
)

// daemon is a minimal kube-proxy in IPVS mode for IPv4: what main.go does, without systemd.
func daemon(cfgPath string) error {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	client, err := proxy.NewClient(cfg.ClientConnection, "", "kube-proxy-ipvsvm-agent")
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	dp, err := ipvs.New(ctx, cfg, v1.IPv4Protocol, cfg.HostnameOverride, reg)
	if err != nil {
		return err
	}
	srv := proxy.NewServer(cfg, client, cfg.HostnameOverride, reg, []proxy.FamilyDataplane{{Family: v1.IPv4Protocol, Dataplane: dp}})
	return srv.Run(ctx)
}

// proc is a started daemon whose output goes to the console with a prefix.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	tail []string
}

func start(prefix string, args ...string) (*proc, error) {
	p := &proc{cmd: exec.Command(args[0], args[1:]...), done: make(chan struct{})}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	w.Close()
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			fmt.Printf("%s: %s\n", prefix, sc.Text())
			p.mu.Lock()
			p.tail = append(p.tail, sc.Text())
			if len(p.tail) > 20 {
				p.tail = p.tail[1:]
			}
			p.mu.Unlock()
		}
		_ = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) lastLines() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, " | ")
}

func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// daemonCase runs the daemon against the host's apiserver: the host creates a Service when asked, the
// client must reach it through the cluster IP; the host deletes it, its virtual server must go; then the
// daemon's --cleanup must leave nothing.
func daemonCase(d *ipvsvm.DaemonParams) (used string, err error) {
	if err := ipvs.Cleanup(context.Background()); err != nil {
		return used, fmt.Errorf("cleaning up before the daemon: %w", err)
	}
	for _, c := range [][]string{
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "addr", "add", "10.0.2.15/24", "dev", "eth0"},
		{"ip", "route", "add", "default", "via", "10.0.2.2"},
	} {
		if err := sh(c...); err != nil {
			return used, err
		}
	}
	binary, used := d.Binary, "the kube-proxy binary"
	p, err := start("kube-proxy", binary, "--config", d.Config)
	if err != nil {
		return used, err
	}
	defer func() { p.stop() }()
	// The real binary exits at once when it cannot run IPVS mode yet: use the agent's stand-in then.
	time.Sleep(3 * time.Second)
	if p.exited() {
		report("NOTE", "daemon binary exited at once ("+p.lastLines()+"); running the agent's IPVS daemon instead")
		binary, used = "", "the agent's stand-in daemon (the binary cannot run IPVS mode yet)"
		if p, err = start("agent-daemon", ipvsvm.AgentPath, "daemon", d.Config); err != nil {
			return used, err
		}
	} else {
		report("NOTE", "daemon binary runs IPVS mode")
	}
	if err := waitFor(90*time.Second, func() error {
		if p.exited() {
			return errStop{fmt.Errorf("daemon exited: %s", p.lastLines())}
		}
		resp, err := http.Get("http://127.0.0.1:10256/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz %d", resp.StatusCode)
		}
		return nil
	}); err != nil {
		return used, fmt.Errorf("daemon not healthy: %w", err)
	}

	report("WAIT", "create-service")
	target := addr(d.ServiceIP, 80)
	if err := waitFor(90*time.Second, func() error {
		if p.exited() {
			return errStop{fmt.Errorf("daemon exited: %s", p.lastLines())}
		}
		h, err := hit("client", "tcp", target, 1, dialTimeout)
		if err != nil {
			return err
		}
		if h.errs() > 0 {
			return fmt.Errorf("%s", h)
		}
		return nil
	}); err != nil {
		return used, fmt.Errorf("the Service never answered: %w", err)
	}
	h, err := hit("client", "tcp", target, 10, dialTimeout)
	if err != nil {
		return used, err
	}
	if err := expect("the daemon's Service", h, map[string]int{"pod1": 5, "pod2": 5}); err != nil {
		return used, err
	}
	report("NOTE", "daemon's Service answered "+h.String())

	report("WAIT", "delete-service")
	c, err := ipvslib.New()
	if err != nil {
		return used, err
	}
	vip := netip.MustParseAddr(d.ServiceIP)
	if err := waitFor(90*time.Second, func() error {
		list, _ := c.Services()
		for _, s := range list {
			if s.Address == vip {
				return errors.New("virtual server still there")
			}
		}
		return nil
	}); err != nil {
		return used, fmt.Errorf("after the Service was deleted: %w", err)
	}
	p.stop()

	cleanup := []string{binary, "--cleanup"}
	if binary == "" {
		cleanup = nil
	}
	if cleanup != nil {
		if out, err := shOut(cleanup...); err != nil {
			report("NOTE", "kube-proxy --cleanup failed ("+strings.TrimSpace(out)+"); cleaning up with rules/ipvs")
			cleanup = nil
		}
	}
	if cleanup == nil {
		if err := ipvs.Cleanup(context.Background()); err != nil {
			return used, err
		}
	}
	return used, leftovers()
}

// errStop ends waitFor at once.
type errStop struct{ error }

func waitFor(limit time.Duration, f func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return nil
		}
		var stop errStop
		if errors.As(err, &stop) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(300 * time.Millisecond)
	}
}
