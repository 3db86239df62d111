package rules

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestUpstreamMetricsTable reads upstream's metric definitions and registrations in the module cache
// (k8s.io/kubernetes pkg/proxy/metrics and component-base's feature metric, at the version go.mod's
// k8s.io/component-base belongs to) and checks upstreamMetrics against them: every metric upstream
// registers on Linux is in the table with its type, help, labels, buckets and modes, and nothing else is.
// It is skipped when the sources are not in the module cache (`go mod download k8s.io/kubernetes@v1.37.2`).
func TestUpstreamMetricsTable(t *testing.T) {
	kubernetes, componentBase := upstreamSources(t)
	got := parseProxyMetrics(t, filepath.Join(kubernetes, "pkg/proxy/metrics"))
	feature := parseMetricVars(t, filepath.Join(componentBase, "metrics/prometheus/feature/metrics.go"), nil)
	if len(feature) != 1 {
		t.Fatalf("component-base's feature metrics: %v, want one", feature)
	}
	for _, m := range feature {
		m.spec.modes = inAll // registered in init(): always there
		got[m.name] = m.spec
	}
	for name, spec := range got {
		want, ok := upstreamMetrics[name]
		switch {
		case spec.modes == 0:
			if ok {
				t.Errorf("%s: in the table, but upstream registers it only in Windows' kernelspace mode", name)
			}
		case !ok:
			t.Errorf("%s: upstream registers it (%s), the table lacks it", name, describeSpec(spec))
		case describeSpec(spec) != describeSpec(want):
			t.Errorf("%s:\nupstream %s\ntable    %s", name, describeSpec(spec), describeSpec(want))
		}
	}
	for name := range upstreamMetrics {
		if _, ok := got[name]; !ok {
			t.Errorf("%s: in the table, not among upstream's", name)
		}
	}
}

func describeSpec(s metricSpec) string {
	return fmt.Sprintf("type=%v help=%q labels=%v buckets=%v modes=%04b", s.typ, s.help, s.labels, s.buckets, s.modes)
}

// upstreamSources returns the module cache directories of k8s.io/kubernetes and k8s.io/component-base
// for the k8s.io/component-base version go.mod requires, or skips the test.
func upstreamSources(t *testing.T) (kubernetes, componentBase string) {
	t.Helper()
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/component-base (v0\.\d+\.\d+)\s*$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod does not require k8s.io/component-base")
	}
	cb := string(m[1])
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		if out, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
			cache = strings.TrimSpace(string(out))
		}
	}
	kubernetes = filepath.Join(cache, "k8s.io", "kubernetes@v1."+strings.TrimPrefix(cb, "v0."))
	componentBase = filepath.Join(cache, "k8s.io", "component-base@"+cb)
	for _, dir := range []string{kubernetes, componentBase} {
		if _, err := os.Stat(dir); cache == "" || err != nil {
			t.Skipf("upstream's sources are not in the module cache (%s): run `go mod download %s`", dir, filepath.Base(dir))
		}
	}
	return kubernetes, componentBase
}

// namedMetric is one metric variable of an upstream source file.
type namedMetric struct {
	name string // the exposed name
	spec metricSpec
}

// parseProxyMetrics reads pkg/proxy/metrics: the metric variables of metrics.go and, from RegisterMetrics,
// the modes each is registered in (none: only in Windows' kernelspace mode). The metrics made from
// descriptions are constant metrics of collectors: it checks that those are counters.
func parseProxyMetrics(t *testing.T, dir string) map[string]metricSpec {
	t.Helper()
	fset := token.NewFileSet()
	src := filepath.Join(dir, "metrics.go")
	f, err := parser.ParseFile(fset, src, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				if lit, ok := vs.Values[0].(*ast.BasicLit); ok {
					consts[vs.Names[0].Name], _ = strconv.Unquote(lit.Value)
				}
			}
		}
	}
	vars := parseMetricVars(t, src, consts)
	collectors, err := os.ReadFile(filepath.Join(dir, "metrics_linux.go"))
	if err != nil {
		t.Fatal(err)
	}
	if c := string(collectors); strings.Count(c, "NewConstMetric(") != strings.Count(c, "NewConstMetric(n.description, metrics.CounterValue") {
		t.Errorf("upstream's collectors make metrics other than counters from their descriptions: the table's types need a look")
	}

	var register *ast.FuncDecl
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "RegisterMetrics" {
			register = fd
		}
	}
	if register == nil {
		t.Fatal("no RegisterMetrics in " + src)
	}
	modes := map[string]modeSet{}
	mark := func(n ast.Node, m modeSet) {
		ast.Inspect(n, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok {
				if _, ok := vars[id.Name]; ok {
					modes[id.Name] |= m
				}
			}
			return true
		})
	}
	var walk func(stmts []ast.Stmt, m modeSet)
	walk = func(stmts []ast.Stmt, m modeSet) {
		for _, st := range stmts {
			switch s := st.(type) {
			case *ast.SwitchStmt:
				for _, c := range s.Body.List {
					cc := c.(*ast.CaseClause)
					var cm modeSet
					for _, e := range cc.List {
						switch sel := e.(*ast.SelectorExpr).Sel.Name; sel {
						case "ProxyModeIPTables":
							cm |= inIPTables
						case "ProxyModeIPVS":
							cm |= inIPVS
						case "ProxyModeNFTables":
							cm |= inNFTables | inNFTablesGate
						case "ProxyModeKernelspace":
						default:
							t.Errorf("RegisterMetrics: unknown mode %s", sel)
						}
					}
					walk(cc.Body, cm)
				}
			case *ast.IfStmt:
				inner := m
				if strings.Contains(exprString(s.Cond), "KubeProxyNFTablesLocalhostNodePorts") {
					inner = m & inNFTablesGate
				}
				if s.Init != nil {
					mark(s.Init, inner)
				}
				mark(s.Cond, inner)
				walk(s.Body.List, inner)
			case *ast.ExprStmt:
				if call, ok := s.X.(*ast.CallExpr); ok && len(call.Args) == 1 {
					if fl, ok := call.Args[0].(*ast.FuncLit); ok { // registerMetricsOnce.Do(func() {...})
						walk(fl.Body.List, m)
						continue
					}
				}
				mark(s, m)
			default:
				mark(s, m)
			}
		}
	}
	walk(register.Body.List, inAll)
	out := map[string]metricSpec{}
	for v, nm := range vars {
		nm.spec.modes = modes[v]
		out[nm.name] = nm.spec
	}
	return out
}

// exprString prints an expression roughly, enough to find a name in it.
func exprString(e ast.Expr) string {
	var b strings.Builder
	ast.Inspect(e, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			b.WriteString(id.Name + " ")
		}
		return true
	})
	return b.String()
}

// parseMetricVars reads the package-level variables of src made by component-base's metric constructors
// (NewHistogramVec, NewGaugeVec, NewCounterVec, NewGauge, NewCounter with their Opts, and NewDesc) and
// returns them by variable name, the help text as component-base exposes it (with the stability level).
// consts resolves the constants the options name.
func parseMetricVars(t *testing.T, src string, consts map[string]string) map[string]namedMetric {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), src, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	str := func(e ast.Expr) string {
		switch v := e.(type) {
		case *ast.BasicLit:
			s, err := strconv.Unquote(v.Value)
			if err != nil {
				t.Fatalf("%s: %v", src, err)
			}
			return s
		case *ast.Ident:
			if s, ok := consts[v.Name]; ok {
				return s
			}
		}
		t.Fatalf("%s: cannot read %T as a string", src, e)
		return ""
	}
	strs := func(e ast.Expr) []string {
		if id, ok := e.(*ast.Ident); ok && id.Name == "nil" {
			return nil
		}
		var out []string
		for _, el := range e.(*ast.CompositeLit).Elts {
			out = append(out, str(el))
		}
		sort.Strings(out)
		return out
	}
	out := map[string]namedMetric{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if len(vs.Values) != 1 {
				continue
			}
			call, ok := vs.Values[0].(*ast.CallExpr)
			if !ok {
				continue
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				continue
			}
			var m namedMetric
			switch ctor := sel.Sel.Name; ctor {
			case "NewDesc":
				level := call.Args[4].(*ast.SelectorExpr).Sel.Name
				m = namedMetric{name: str(call.Args[0]),
					spec: metricSpec{typ: counter, help: "[" + level + "] " + str(call.Args[1]), labels: strs(call.Args[2])}}
			case "NewHistogramVec", "NewGaugeVec", "NewCounterVec", "NewGauge", "NewCounter":
				m.spec.typ = map[string]dto.MetricType{"NewHistogramVec": histogram, "NewGaugeVec": gauge, "NewCounterVec": counter,
					"NewGauge": gauge, "NewCounter": counter}[ctor]
				if len(call.Args) == 2 {
					m.spec.labels = strs(call.Args[1])
				}
				var parts []string
				level := "ALPHA" // component-base's default
				for _, el := range call.Args[0].(*ast.UnaryExpr).X.(*ast.CompositeLit).Elts {
					kv := el.(*ast.KeyValueExpr)
					switch key := kv.Key.(*ast.Ident).Name; key {
					case "Namespace", "Subsystem", "Name":
						if p := str(kv.Value); p != "" {
							parts = append(parts, p)
						}
					case "Help":
						m.spec.help = str(kv.Value)
					case "StabilityLevel":
						level = kv.Value.(*ast.SelectorExpr).Sel.Name
					case "Buckets":
						m.spec.buckets = evalBuckets(t, kv.Value)
					}
				}
				m.name = strings.Join(parts, "_")
				m.spec.help = "[" + level + "] " + m.spec.help
			default:
				continue
			}
			out[vs.Names[0].Name] = m
		}
	}
	return out
}

// evalBuckets computes a buckets expression made of component-base's ExponentialBuckets, LinearBuckets
// and MergeBuckets (which, as upstream's does, puts a 0 in front) over number literals.
func evalBuckets(t *testing.T, e ast.Expr) []float64 {
	t.Helper()
	call, ok := e.(*ast.CallExpr)
	if !ok {
		t.Fatalf("buckets: cannot evaluate %T", e)
	}
	num := func(e ast.Expr) float64 {
		lit, ok := e.(*ast.BasicLit)
		if !ok {
			t.Fatalf("buckets: %T is not a number", e)
		}
		v, err := strconv.ParseFloat(lit.Value, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	switch name := call.Fun.(*ast.SelectorExpr).Sel.Name; name {
	case "ExponentialBuckets":
		return prometheus.ExponentialBuckets(num(call.Args[0]), num(call.Args[1]), int(num(call.Args[2])))
	case "LinearBuckets":
		return prometheus.LinearBuckets(num(call.Args[0]), num(call.Args[1]), int(num(call.Args[2])))
	case "MergeBuckets":
		out := []float64{0}
		for _, a := range call.Args {
			out = append(out, evalBuckets(t, a)...)
		}
		return out
	default:
		t.Fatalf("buckets: %s is not modelled", name)
		return nil
	}
}

// The table's own sanity: every bucket list is sorted, as Prometheus wants it.
func TestUpstreamMetricsTableBuckets(t *testing.T) {
	for name, m := range upstreamMetrics {
		if !slices.IsSorted(m.buckets) {
			t.Errorf("%s: buckets not sorted: %v", name, m.buckets)
		}
	}
}
