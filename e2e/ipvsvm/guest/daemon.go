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
	"strings"
	"sync"
	"syscall"
	"time"

	ipvslib "github.com/cloudflare/ipvs"

	"kube-proxy/e2e/ipvsvm"
	"kube-proxy/rules/ipvs"
)

// proc is a started daemon whose output goes to the console with a prefix (nowhere without one; its last
// lines are kept either way).
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
			if prefix != "" {
				fmt.Printf("%s: %s\n", prefix, sc.Text())
			}
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
func daemonCase(d *ipvsvm.DaemonParams) error {
	if err := ipvs.Cleanup(context.Background()); err != nil {
		return fmt.Errorf("cleaning up before the daemon: %w", err)
	}
	for _, c := range [][]string{
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "addr", "add", "10.0.2.15/24", "dev", "eth0"},
		{"ip", "route", "add", "default", "via", "10.0.2.2"},
	} {
		if err := sh(c...); err != nil {
			return err
		}
	}
	p, err := start("kube-proxy", d.Binary, "--config", d.Config)
	if err != nil {
		return err
	}
	defer p.stop()
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
		return fmt.Errorf("daemon not healthy: %w", err)
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
		return fmt.Errorf("the Service never answered: %w", err)
	}
	h, err := hit("client", "tcp", target, 10, dialTimeout)
	if err != nil {
		return err
	}
	if err := expect("the daemon's Service", h, map[string]int{"pod1": 5, "pod2": 5}); err != nil {
		return err
	}
	report("NOTE", "daemon's Service answered "+h.String())
	if err := traceAgrees(d, target); err != nil {
		return err
	}
	if err := diffAgrees(d, target); err != nil {
		return err
	}

	report("WAIT", "delete-service")
	c, err := ipvslib.New()
	if err != nil {
		return err
	}
	vip := netip.MustParseAddr(d.ServiceIP)
	if err := waitFor(90*time.Second, func() error {
		list, err := services(c)
		if err != nil {
			return err
		}
		for _, s := range list {
			if s.Address == vip {
				return errors.New("virtual server still there")
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("after the Service was deleted: %w", err)
	}
	p.stop()

	if out, err := shOut(d.Binary, "--cleanup"); err != nil {
		return fmt.Errorf("kube-proxy --cleanup: %w: %s", err, strings.TrimSpace(out))
	}
	return leftovers()
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
