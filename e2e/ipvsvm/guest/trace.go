package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"kube-proxy/e2e/ipvsvm"
)

// traceJSON is what `kube-proxy trace --json` prints, as far as the check reads it.
type traceJSON struct {
	Reaches bool `json:"reaches"`
	Walks   []struct {
		Dataplane string `json:"dataplane"`
		Outcomes  []struct {
			Verdict  string `json:"verdict"`
			Endpoint string `json:"endpoint"`
			Reason   string `json:"reason"`
		} `json:"outcomes"`
	} `json:"walks"`
}

// runTrace runs the daemon binary's `trace` verb (read-only) with the daemon's configuration; it returns
// the parsed JSON, the exit code and the human-readable output of the same trace.
func runTrace(d *ipvsvm.DaemonParams, args ...string) (traceJSON, int, string, error) {
	base := append([]string{"trace", "--config", d.Config}, args...)
	text, _ := exec.Command(d.Binary, base...).CombinedOutput()
	out, err := exec.Command(d.Binary, append(base, "--json")...).Output()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return traceJSON{}, 0, "", err
	}
	var tr traceJSON
	if err := json.Unmarshal(out, &tr); err != nil {
		return traceJSON{}, code, string(text), fmt.Errorf("kube-proxy trace %v: %w: %s", args, err, out)
	}
	return tr, code, string(text), nil
}

// traceAgrees checks `kube-proxy trace` on the live IPVS node against real connections from the client
// namespace: the Service's virtual server reaches both pods, half each, and a port the Service does not
// serve on its cluster IP is rejected (KUBE-IPVS-FILTER), as the connections find.
func traceAgrees(d *ipvsvm.DaemonParams, target string) error {
	from := []string{"--from", ipvsvm.ClientIP, "--in", "vc1"}
	tr, code, text, err := runTrace(d, append([]string{"--to", target + "/tcp"}, from...)...)
	if err != nil {
		return err
	}
	report("NOTE", "kube-proxy trace --to "+target+":\n"+text)
	var eps, reasons []string
	for _, w := range tr.Walks {
		for _, o := range w.Outcomes {
			eps = append(eps, o.Endpoint)
			reasons = append(reasons, o.Reason)
		}
	}
	slices.Sort(eps)
	want := []string{podIP(1) + ":80", podIP(2) + ":80"}
	if code != 0 || !tr.Reaches || !slices.Equal(eps, want) || !strings.Contains(strings.Join(reasons, "\n"), "by IPVS virtual server tcp/"+target) {
		return fmt.Errorf("kube-proxy trace to %s: exit %d, reaches %v, endpoints %v (want %v), reasons %q", target, code, tr.Reaches, eps, want, reasons)
	}
	h, err := hit("client", "tcp", target, 10, dialTimeout)
	if err != nil {
		return err
	}
	if err := expect("connections traced to both pods", h, map[string]int{"pod1": 5, "pod2": 5}); err != nil {
		return err
	}

	other := strings.TrimSuffix(target, ":80") + ":81"
	tr, code, text, err = runTrace(d, append([]string{"--to", other + "/tcp"}, from...)...)
	if err != nil {
		return err
	}
	report("NOTE", "kube-proxy trace --to "+other+":\n"+text)
	verdicts := ""
	for _, w := range tr.Walks {
		for _, o := range w.Outcomes {
			verdicts += o.Verdict + " "
		}
	}
	reasons = nil
	for _, w := range tr.Walks {
		for _, o := range w.Outcomes {
			reasons = append(reasons, o.Reason)
		}
	}
	if !strings.Contains(strings.Join(reasons, ""), "KUBE-IPVS-FILTER rejects it") {
		return fmt.Errorf("kube-proxy trace to %s: reasons %q do not name KUBE-IPVS-FILTER", other, reasons)
	}
	if code != 1 || tr.Reaches || strings.TrimSpace(verdicts) != "REJECT" {
		return fmt.Errorf("kube-proxy trace to %s (a port the Service does not serve): exit %d, reaches %v, verdicts %q, want REJECT", other, code, tr.Reaches, verdicts)
	}
	h, err = hit("client", "tcp", other, 3, dialTimeout)
	if err != nil {
		return err
	}
	if h.by["ERR:refused"] != 3 {
		return fmt.Errorf("connections to %s: %s, want all refused as the trace says", other, h)
	}
	return nil
}

// diffAgrees checks `kube-proxy diff` on the live IPVS node: no drift once the daemon has synced; a
// virtual server deleted behind the daemon's back is named, with its real servers.
func diffAgrees(d *ipvsvm.DaemonParams, target string) error {
	type drift struct{ Kind, Object, Detail string }
	run := func() ([]drift, int, string, error) {
		text, _ := exec.Command(d.Binary, "diff", "--config", d.Config).CombinedOutput()
		out, err := exec.Command(d.Binary, "diff", "--config", d.Config, "--json").Output()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			return nil, 0, "", err
		}
		var rep struct{ Drift []drift }
		if err := json.Unmarshal(out, &rep); err != nil {
			return nil, code, string(text), fmt.Errorf("kube-proxy diff --json: %w: %s", err, out)
		}
		return rep.Drift, code, string(text), nil
	}
	drifts, code, text, err := run()
	if err != nil {
		return err
	}
	report("NOTE", "kube-proxy diff on the synced node:\n"+text)
	if code != 0 || len(drifts) > 0 {
		return fmt.Errorf("kube-proxy diff on a synced IPVS node: exit %d, drift %v", code, drifts)
	}
	if err := sh("ipvsadm", "-D", "-t", target); err != nil {
		return err
	}
	drifts, code, text, err = run()
	if err != nil {
		return err
	}
	report("NOTE", "kube-proxy diff after ipvsadm -D -t "+target+":\n"+text)
	named := false
	for _, x := range drifts {
		named = named || (x.Kind == "missing" && x.Object == "virtual server tcp/"+target)
	}
	if code != 1 || !named {
		return fmt.Errorf("kube-proxy diff after deleting the virtual server %s: exit %d, drift %v", target, code, drifts)
	}
	return nil
}
