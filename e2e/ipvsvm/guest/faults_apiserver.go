//go:build linux

package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"kube-proxy/e2e/faults"
	"kube-proxy/e2e/ipvsvm"
)

// apiserverDown has the host stop its apiserver with traffic flowing, start it again, then create a
// Service and times it from its creation to its first answer.
func (b *fb) apiserverDown() error {
	down := mustDuration(b.p.APIDown)
	d := b.d
	offset := d.logSize()
	o := observe(b.targets)
	if _, err := b.control(ipvsvm.ActionStopAPIServer, nil); err != nil {
		o.end()
		return err
	}
	stopped := time.Now()
	// How a connection to the stopped apiserver fails from the VM (qemu's user network stands between).
	dial, conns := "not tried", "not read"
	if api, err := apiserverAddr(); err == nil {
		time.Sleep(2 * time.Second)
		conns = formatCounts(tcpStates(api))
		c, err := net.DialTimeout("tcp", api, 3*time.Second)
		switch {
		case err == nil:
			c.Close()
			dial = "accepted"
		default:
			dial = errClass(err) + fmt.Sprintf(" after %v", time.Since(stopped).Round(100*time.Millisecond))
		}
	}
	time.Sleep(down - time.Since(stopped))
	starting := time.Now()
	if _, err := b.control(ipvsvm.ActionStartAPIServer, nil); err != nil {
		o.end()
		return err
	}
	started := time.Now()
	res, seen := o.end()
	// When connections failed, against the apiserver's start on the host (which competes with the VM
	// for the host's two cores).
	when := ""
	if failures(res) > 0 {
		var at []string
		for _, r := range res {
			if r.err != "" && len(at) < 10 {
				at = append(at, fmt.Sprintf("+%.1f s", r.at.Sub(stopped).Seconds()))
			}
		}
		when = fmt.Sprintf("connections failed at %s from the stop, the host starting its apiserver from +%.1f s to +%.1f s; ",
			strings.Join(at, ", "), starting.Sub(stopped).Seconds(), started.Sub(stopped).Seconds())
	}
	start := time.Now()
	ip, err := b.control(ipvsvm.ActionCreate, url.Values{"name": {"after"}, "pod": {"2"}})
	if err != nil {
		return err
	}
	_, rerr := reachable(addr(ip, 80), time.Minute)
	converge := time.Since(start)
	b.row(faults.Row{Order: 10, Fault: fmt.Sprintf("API server stopped for %v", down),
		Action: "stop kube-apiserver with traffic to a cluster IP and a NodePort; start it; create a Service",
		Sent:   len(res), Failed: failures(res), Converge: faults.Seconds(converge) + " (new Service, from its creation)",
		Sees: fmt.Sprintf("%s/healthz %s during the outage; the daemon's TCP connections to it 2 s after it stopped: %s, a new one: %s; log: %q", when, formatCodes(seen), conns, dial,
			firstOf(d.logLine(offset, "connection refused"), d.logLine(offset, "Failed to watch"), d.logLine(offset, "^E"), "(nothing about it)"))})
	d.notes("the daemon's log during and after the outage", offset, `refused|backoff|Watch close|^[EW]|[Ww]atch|[Rr]eflector|Synced IPVS`)
	return errors.Join(rerr, d.alive("after the outage"), noFailures("while the apiserver was down", res),
		healthOnly200(seen), within("the new Service after the outage", converge, apiserverBackoff))
}

// apiserverBackoff bounds how long a change made once the apiserver is back may take to land in the VM
// (e2e/faults wants 2 s on the host). There, the apiserver refuses the daemon's new watches at once
// (qemu's user network refuses for the stopped port: client-go logs "Watch failed - backing off" at V(4)
// only); once it is back, they are refused as too old (410: the restarted apiserver's cache starts at a
// newer resource version), and client-go's reflector lists again only after its backoff (up to 30 s,
// jittered): 4-32 s measured (outages of 6 s to 2 min).
const apiserverBackoff = time.Minute

// tcpStates counts the VM's IPv4 TCP sockets connected to hostPort by state (/proc/net/tcp).
func tcpStates(hostPort string) map[string]int {
	out := map[string]int{}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return out
	}
	ip := net.ParseIP(host).To4()
	p, _ := strconv.Atoi(port)
	if ip == nil {
		return out
	}
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], p)
	names := map[string]string{"01": "ESTABLISHED", "02": "SYN_SENT", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
		"06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0B": "CLOSING"}
	b, _ := os.ReadFile("/proc/net/tcp")
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 3 && f[2] == want {
			out[firstOf(names[f[3]], f[3])]++
		}
	}
	return out
}

// apiserverAddr is the apiserver's host:port in the daemon's kubeconfig.
func apiserverAddr() (string, error) {
	b, err := os.ReadFile(ipvsvm.KubeconfigPath)
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`server: https://([^/\s]+)`).FindSubmatch(b)
	if m == nil {
		return "", errors.New("no server in the kubeconfig")
	}
	return string(m[1]), nil
}

func healthOnly200(seen map[int]int) error {
	if len(seen) != 1 || seen[200] == 0 {
		return fmt.Errorf("/healthz during the outage: %s, want 200 only (nothing was queued)", formatCodes(seen))
	}
	return nil
}
