//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	ipvslib "github.com/cloudflare/ipvs"

	"kube-proxy/e2e/ipvsvm"
	"kube-proxy/e2e/probe"
	"kube-proxy/rules/ipvs"
)

// startDaemon starts args as a daemon logging to /tmp/NAME.log and, with echo set, to the console too
// (each line after "NAME: "). Like the rows' daemons (fb.start), it gets neither a process group of its
// own nor a parent-death signal.
func startDaemon(name string, echo bool, args ...string) (*probe.Process, error) {
	p := probe.NewProcess(name, "/tmp/"+name+".log")
	if echo {
		p.Echo = probe.PrefixLines(os.Stdout, name)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if err := p.Start(cmd); err != nil {
		return nil, err
	}
	return p, nil
}

// lastLines returns the end of a daemon's log on one line (kp.tail for the rows' daemons).
func lastLines(p *probe.Process) string { return strings.ReplaceAll(p.LogTail(20), "\n", " | ") }

// stopDaemon stops a daemon with SIGTERM, killing it after 10 s.
func stopDaemon(p *probe.Process) { _ = p.Stop(syscall.SIGTERM, 10*time.Second) }

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
	p, err := startDaemon("kube-proxy", true, d.Binary, "--config", d.Config)
	if err != nil {
		return err
	}
	defer stopDaemon(p)
	if err := waitFor(90*time.Second, func() error {
		if p.Exited() {
			return errStop{fmt.Errorf("daemon exited: %s", lastLines(p))}
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
		if p.Exited() {
			return errStop{fmt.Errorf("daemon exited: %s", lastLines(p))}
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
	stopDaemon(p)

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
