//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"kube-proxy/e2e/faults"
)

// reload reloads an invalid configuration and one changing a restart-only field, with traffic flowing:
// both refused, the running configuration kept.
func (b *fb) reload() error {
	d := b.d
	good, err := os.ReadFile(b.p.Config)
	if err != nil {
		return err
	}
	defer os.WriteFile(b.p.Config, good, 0o600)
	var errs []error
	for i, c := range []struct{ fault, edit, result string }{
		{"an invalid config on reload", "a misspelt field (syncPeriood) in the file", "invalid"},
		{"a restart-only field changed on reload", "healthzBindAddress changed in the file", "restart-required"},
	} {
		tr := startTraffic(b.targets)
		tr.waitFor(20)
		body := string(good)
		if c.result == "invalid" {
			body += "syncPeriood: 1s\n"
		} else {
			body = strings.Replace(body, "127.0.0.1:10256", "127.0.0.1:10266", 1)
		}
		if err := os.WriteFile(b.p.Config, []byte(body), 0o600); err != nil {
			tr.stop()
			return err
		}
		label := fmt.Sprintf("result=%q", c.result)
		before := metric("kubeproxy_config_reloads_total", label)
		if err := d.proc.Signal(syscall.SIGHUP); err != nil {
			tr.stop()
			return err
		}
		err := waitFor(30*time.Second, func() error {
			if metric("kubeproxy_config_reloads_total", label) > before {
				return nil
			}
			return errors.New("no reload outcome yet")
		})
		tr.waitFor(tr.count() + 20)
		res := tr.stop()
		if werr := os.WriteFile(b.p.Config, good, 0o600); werr != nil {
			return werr
		}
		code, herr := healthzErr("127.0.0.1:10256")
		// The STATUS line follows the metric; give it a moment under TCG.
		_ = waitFor(10*time.Second, func() error {
			if strings.Contains(d.status(), "last reload "+c.result) {
				return nil
			}
			return errors.New("not yet")
		})
		status := d.status()
		b.row(faults.Row{Order: 60 + i, Fault: c.fault,
			Action: c.edit + ", SIGHUP (systemctl reload) with traffic flowing",
			Sent:   len(res), Failed: failures(res), Converge: "nothing to converge: refused",
			Sees: fmt.Sprintf("kubeproxy_config_reloads_total{result=%q} +%v; STATUS %q; /healthz %d on the old address (%v)",
				c.result, metric("kubeproxy_config_reloads_total", label)-before, status, code, herr)})
		errs = append(errs, err, d.alive("after the reload"), noFailures(c.fault, res))
		if !strings.Contains(status, "last reload "+c.result) {
			errs = append(errs, fmt.Errorf("%s: STATUS %q does not say so", c.fault, status))
		}
	}
	return errors.Join(errs...)
}
