package results

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// Groups are the test groups the document counts, by the prefix of their tests' names.
var Groups = []struct{ Name, Prefix string }{
	{"Services", "[sig-network] Services "},
	{"Networking Granular Checks: Services", "[sig-network] Networking Granular Checks: Services "},
}

// conformanceTag marks the tests of the conformance profile.
const conformanceTag = "[Conformance]"

// Markdown renders res as docs/CONFORMANCE.md. command is how the document was made.
func Markdown(res *Results, command string) (string, error) {
	focus, err := regexp.Compile(res.Meta.Focus)
	if err != nil {
		return "", fmt.Errorf("focus: %w", err)
	}
	skip, err := regexp.Compile(res.Meta.Skip)
	if err != nil {
		return "", fmt.Errorf("skip: %w", err)
	}
	t := newTable(res, func(name string) bool {
		return focus.MatchString(name) && (res.Meta.Skip == "" || !skip.MatchString(name)) && group(name) != ""
	})
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }

	w("# Conformance: upstream's e2e tests against this kube-proxy\n\n")
	w("Written by `%s` from the results of `%s` (%s); do not edit by hand.\n\n", command, res.Meta.Command,
		res.Meta.Date.Format("2006-01-02 15:04 MST"))
	w("Upstream's own tests for Services (`k8s.io/kubernetes/test/e2e`, `--provider=local`) ran against a real\n")
	w("three-node cluster on one machine: each node a network namespace on one bridge with its own containerd,\n")
	w("kubelet and CNI bridge; etcd, the apiserver, the controller-manager, the scheduler and CoreDNS beside\n")
	w("them. The same bed ran upstream's kube-proxy in the modes it shares with ours, so every test is judged\n")
	w("against what upstream does here, not against a claim. Mode ipvs cannot run on this bed: the host kernel\n")
	w("has no IP_VS (mode ipvs is tested in a VM instead: e2e/ipvsvm).\n\n")
	w("- Tests: ginkgo `--focus='%s'` `--skip='%s'`, %d processes.\n", res.Meta.Focus, res.Meta.Skip, res.Meta.Procs)
	w("- Versions: %s.\n", versions(res.Meta.Versions))
	if builds := kubeProxyBuilds(res.Runs); builds != "" {
		w("- The runs tested different builds of ours (the results were gathered over more than one\n")
		w("  invocation, -resume): %s.\n", builds)
	}
	w("- \"process\" is the hard way (the binary in the node's namespace with a config file and a kubeconfig, as\n")
	w("  systemd/kube-proxy.service runs it); \"DaemonSet\" is packaging/kubernetes/kube-proxy.yaml applied with\n")
	w("  the image built from packaging/container/Dockerfile.\n\n")

	w("## Summary\n\npassed / failed / skipped, per group and run.\n\n")
	w("| group |")
	for _, r := range res.Runs {
		w(" %s |", r.Label())
	}
	w("\n|---|%s\n", strings.Repeat("---|", len(res.Runs)))
	for _, g := range Groups {
		w("| %s |", g.Name)
		for i := range res.Runs {
			w(" %s |", t.count(i, func(n string) bool { return strings.HasPrefix(n, g.Prefix) }))
		}
		w("\n")
	}
	w("| of which `[Conformance]` |")
	for i := range res.Runs {
		w(" %s |", t.count(i, func(n string) bool { return strings.Contains(n, conformanceTag) }))
	}
	w("\n\n")
	for _, r := range res.Runs {
		if r.Error != "" {
			w("- **%s did not complete:** %s\n", r.Label(), oneLine(r.Error, 300))
		}
	}

	w("\n## Against upstream\n\n")
	for i, r := range res.Runs {
		if r.Impl != "ours" {
			continue
		}
		if r.Mode == "userspace" {
			w("- %s: upstream has no mode userspace; against upstream in mode iptables, it %s.\n", r.Label(),
				t.verdict(i, t.upstream("iptables")))
			continue
		}
		w("- %s: %s.\n", r.Label(), t.verdict(i, t.upstream(r.Mode)))
	}

	w("\n## Failures\n\n")
	failures := t.failures()
	if len(failures) == 0 {
		w("None.\n")
	}
	for _, f := range failures {
		w("- `%s`\n", f.name)
		for _, i := range f.runs {
			r := res.Runs[i]
			note := ""
			if r.Impl == "ours" {
				up := t.upstream(r.Mode)
				switch {
				case r.Mode == "userspace":
					note = " Upstream has no mode userspace."
				case up < 0:
					note = fmt.Sprintf(" Upstream was not run in mode %s.", r.Mode)
				case t.status(up, f.name) == "passed":
					note = " Upstream passes it on the same bed."
				case t.status(up, f.name) == "":
					note = " Upstream did not run it."
				default:
					note = fmt.Sprintf(" Upstream %s it too.", verb(t.status(up, f.name)))
				}
			}
			w("  - %s: %s%s\n", r.Label(), oneLine(t.message(i, f.name), 400), note)
		}
	}

	w("\n## Skipped at run time\n\nTests the selection chose that skipped themselves (a provider, a feature or\n")
	w("a node setup this bed does not have), with the reason the test gave; the same in every run unless said.\n\n")
	skips := t.skips()
	if len(skips) == 0 {
		w("None.\n")
	}
	for _, s := range skips {
		w("- `%s`: %s\n", s.name, oneLine(s.message, 300))
	}

	w("\n## Every test\n\n✓ passed, ✗ failed, – skipped, blank: not run.\n\n| test |")
	for _, r := range res.Runs {
		w(" %s |", r.Label())
	}
	w("\n|---|%s\n", strings.Repeat("---|", len(res.Runs)))
	for _, name := range t.names {
		w("| %s |", strings.ReplaceAll(name, "|", `\|`))
		for i := range res.Runs {
			w(" %s |", mark(t.status(i, name)))
		}
		w("\n")
	}

	w("\n## Time\n\n| part | seconds | note |\n|---|---:|---|\n")
	for _, p := range res.Meta.Phases {
		w("| %s | %.0f | %s |\n", p.Name, p.Seconds, p.Note)
	}
	return b.String(), nil
}

// table indexes every selected test's result per run.
type table struct {
	res   *Results
	names []string
	cases []map[string]Case // per run
}

func newTable(res *Results, selected func(string) bool) *table {
	t := &table{res: res}
	seen := map[string]bool{}
	for _, r := range res.Runs {
		m := map[string]Case{}
		for _, c := range r.Cases {
			if !selected(c.Name) {
				continue
			}
			m[c.Name] = c
			if !seen[c.Name] {
				seen[c.Name] = true
				t.names = append(t.names, c.Name)
			}
		}
		t.cases = append(t.cases, m)
	}
	sort.Slice(t.names, func(i, j int) bool {
		gi, gj := groupIndex(t.names[i]), groupIndex(t.names[j])
		if gi != gj {
			return gi < gj
		}
		return t.names[i] < t.names[j]
	})
	return t
}

func (t *table) status(run int, name string) string {
	if run < 0 {
		return ""
	}
	return t.cases[run][name].Status
}

func (t *table) message(run int, name string) string { return t.cases[run][name].Message }

// upstream is the index of upstream's process run in mode, or -1.
func (t *table) upstream(mode string) int {
	for i, r := range t.res.Runs {
		if r.Impl == "upstream" && r.Mode == mode && r.Way == "process" {
			return i
		}
	}
	return -1
}

func (t *table) count(run int, in func(string) bool) string {
	var p, f, s int
	for _, name := range t.names {
		if !in(name) {
			continue
		}
		switch st := t.status(run, name); {
		case st == "passed":
			p++
		case st == "skipped" || st == "pending":
			s++
		case st != "":
			f++
		}
	}
	if p+f+s == 0 {
		return "–"
	}
	return fmt.Sprintf("%d / %d / %d", p, f, s)
}

// verdict says whether run passes every test run up passes.
func (t *table) verdict(run, up int) string {
	if up < 0 {
		return "upstream was not run in this mode"
	}
	var missing []string
	n := 0
	for _, name := range t.names {
		if t.status(up, name) != "passed" {
			continue
		}
		n++
		if t.status(run, name) != "passed" {
			missing = append(missing, "`"+name+"`")
		}
	}
	if len(missing) == 0 {
		return fmt.Sprintf("passes all %d tests upstream passes", n)
	}
	return fmt.Sprintf("passes %d of the %d tests upstream passes; not: %s", n-len(missing), n, strings.Join(missing, ", "))
}

type failure struct {
	name string
	runs []int
}

func (t *table) failures() []failure {
	var out []failure
	for _, name := range t.names {
		f := failure{name: name}
		for i := range t.res.Runs {
			if st := t.status(i, name); st != "" && st != "passed" && st != "skipped" && st != "pending" {
				f.runs = append(f.runs, i)
			}
		}
		if len(f.runs) > 0 {
			out = append(out, f)
		}
	}
	return out
}

type skipped struct{ name, message string }

func (t *table) skips() []skipped {
	var out []skipped
	for _, name := range t.names {
		msgs := map[string]bool{}
		var first string
		for i := range t.res.Runs {
			if t.status(i, name) == "skipped" {
				m := oneLine(t.message(i, name), 300)
				if first == "" {
					first = m
				}
				msgs[m] = true
			}
		}
		if first == "" {
			continue
		}
		if len(msgs) > 1 {
			first += " (the reason differs between runs)"
		}
		out = append(out, skipped{name, first})
	}
	return out
}

func group(name string) string {
	if i := groupIndex(name); i < len(Groups) {
		return Groups[i].Name
	}
	return ""
}

func groupIndex(name string) int {
	for i, g := range Groups {
		if strings.HasPrefix(name, g.Prefix) {
			return i
		}
	}
	return len(Groups)
}

func mark(status string) string {
	switch status {
	case "passed":
		return "✓"
	case "skipped", "pending":
		return "–"
	case "":
		return ""
	}
	return "✗"
}

func verb(status string) string {
	if status == "failed" {
		return "fails"
	}
	return "ends " + status + " in"
}

func versions(v map[string]string) string {
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+" "+v[k])
	}
	return strings.Join(parts, ", ")
}

// kubeProxyBuilds lists the version each of our runs tested, when they differ; "" when they are the same.
func kubeProxyBuilds(runs []*Run) string {
	var parts []string
	seen := map[string]bool{}
	for _, r := range runs {
		if r.Impl != "ours" || r.KubeProxy == "" {
			continue
		}
		seen[r.KubeProxy] = true
		parts = append(parts, fmt.Sprintf("%s: %s", r.Label(), r.KubeProxy))
	}
	if len(seen) < 2 {
		return ""
	}
	return strings.Join(parts, "; ")
}

// oneLine folds s onto one line of at most n characters.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// WriteDocument renders the results directory dir into the file out.
func WriteDocument(dir, out string) error {
	res, err := Load(dir)
	if err != nil {
		return err
	}
	md, err := Markdown(res, "go run ./e2e/conformance/report -results "+dir)
	if err != nil {
		return err
	}
	return os.WriteFile(out, []byte(md), 0o644)
}
