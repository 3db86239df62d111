// Package results holds what `make conformance` records (the bed, each run of upstream's e2e tests,
// the JUnit reports) and turns it into docs/CONFORMANCE.md. It has no dependency on the lab, so the
// document can be rewritten from a results directory anywhere.
//
// A results directory holds meta.json (Meta) and, per run, runs/<impl>-<mode>-<way>/run.json (Run)
// beside that run's junit.xml.
package results

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Meta describes one `make conformance`: where and when it ran, what it ran, and how long each part took.
type Meta struct {
	// Date is when the run started (UTC).
	Date time.Time `json:"date"`
	// Command is what was run.
	Command string `json:"command"`
	// Versions maps a component (kubernetes, ours, containerd, runc, coredns, kernel, go) to its version.
	Versions map[string]string `json:"versions"`
	// Focus and Skip are the ginkgo regular expressions that chose the tests.
	Focus string `json:"focus"`
	Skip  string `json:"skip"`
	// Procs is the number of ginkgo processes.
	Procs int `json:"procs"`
	// Phases are the parts of the run with their durations, in order.
	Phases []Phase `json:"phases"`
}

// Phase is one timed part of a run.
type Phase struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	// Note says what the time covers (cached, built, ...).
	Note string `json:"note,omitempty"`
}

// Run is one run of the e2e tests against one kube-proxy.
type Run struct {
	// Impl is "ours" or "upstream"; Mode the proxy mode; Way "process" or "daemonset".
	Impl string `json:"impl"`
	Mode string `json:"mode"`
	Way  string `json:"way"`
	// Start and Seconds time the tests (not the kube-proxy's start).
	Start   time.Time `json:"start"`
	Seconds float64   `json:"seconds"`
	// Command is the ginkgo command line.
	Command string `json:"command"`
	// ExitCode is ginkgo's (non-zero when a test failed).
	ExitCode int `json:"exitCode"`
	// Error is set when the run could not be carried out (kube-proxy did not start, no report, ...).
	Error string `json:"error,omitempty"`
	// KubeProxy is the version of the kube-proxy under test, as its --version prints it on one line.
	KubeProxy string `json:"kubeProxy,omitempty"`

	// Cases are the tests, read from junit.xml by Load.
	Cases []Case `json:"-"`
}

// Name is the run's directory name.
func (r *Run) Name() string { return r.Impl + "-" + r.Mode + "-" + r.Way }

// Label is the run's column heading.
func (r *Run) Label() string {
	way := "process"
	if r.Way == "daemonset" {
		way = "DaemonSet"
	}
	return fmt.Sprintf("%s %s (%s)", r.Impl, r.Mode, way)
}

// Case is one test's result.
type Case struct {
	// Name is the test's full text ("[sig-network] Services should ...").
	Name string
	// Status is passed, failed, skipped or another ginkgo state (panicked, timedout, interrupted, ...).
	Status string
	// Message is the failure's or the skip's message.
	Message string
	Seconds float64
}

// WriteJSON writes v as indented JSON to path.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Complete reports whether run is carried out: ginkgo ran and left its report (its tests may have failed).
func (r *Run) Complete() bool { return r.Error == "" }

// Results is a results directory, loaded.
type Results struct {
	Meta Meta
	Runs []*Run
}

// Load reads a results directory.
func Load(dir string) (*Results, error) {
	res := &Results{}
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &res.Meta); err != nil {
		return nil, fmt.Errorf("meta.json: %w", err)
	}
	runDirs, err := filepath.Glob(filepath.Join(dir, "runs", "*", "run.json"))
	if err != nil {
		return nil, err
	}
	for _, path := range runDirs {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		run := &Run{}
		if err := json.Unmarshal(b, run); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if f, err := os.Open(filepath.Join(filepath.Dir(path), "junit.xml")); err == nil {
			run.Cases, err = ParseJUnit(f)
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", filepath.Join(filepath.Dir(path), "junit.xml"), err)
			}
		}
		res.Runs = append(res.Runs, run)
	}
	sort.SliceStable(res.Runs, func(i, j int) bool { return runOrder(res.Runs[i]) < runOrder(res.Runs[j]) })
	return res, nil
}

// runOrder sorts ours before upstream, then by mode (iptables, nftables, userspace), process before
// DaemonSet.
func runOrder(r *Run) string {
	impl := map[string]string{"ours": "0", "upstream": "1"}[r.Impl]
	mode := map[string]string{"iptables": "0", "nftables": "1", "userspace": "2", "ipvs": "3"}[r.Mode]
	way := map[string]string{"process": "0", "daemonset": "1"}[r.Way]
	return impl + mode + way + r.Mode
}

// junitSuites is the part of a ginkgo JUnit report this package reads.
type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Body    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
				Body    string `xml:",chardata"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// leafPrefix is the node type ginkgo puts before a spec's text in its JUnit names.
var leafPrefix = regexp.MustCompile(`^\[(It|SynchronizedBeforeSuite|BeforeSuite|SynchronizedAfterSuite|AfterSuite|DeferCleanup \([^)]*\)|ReportAfterSuite|ReportBeforeSuite)\] `)

// labelSuffix is the list of ginkgo labels ginkgo appends to a spec's text ("[sig-network, Conformance]");
// every e2e test has its SIG's label, which tells the list from a tag at the end of the text
// ("[LinuxOnly]").
var labelSuffix = regexp.MustCompile(` \[([^\[\]]*)\]$`)

// ParseJUnit reads a ginkgo JUnit report. Only specs ("[It] ...") are returned, named by their text
// without ginkgo's node type and label list.
func ParseJUnit(r io.Reader) ([]Case, error) {
	var doc junitSuites
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return nil, err
	}
	var out []Case
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			m := leafPrefix.FindStringSubmatch(c.Name)
			if m == nil || m[1] != "It" {
				continue
			}
			name := strings.TrimSpace(strings.TrimPrefix(c.Name, m[0]))
			if m := labelSuffix.FindStringSubmatch(name); m != nil && hasSIGLabel(m[1]) {
				name = strings.TrimSpace(strings.TrimSuffix(name, m[0]))
			}
			k := Case{Name: name, Status: c.Status, Seconds: c.Time}
			switch {
			case c.Failure != nil:
				k.Message = firstNonEmpty(c.Failure.Message, c.Failure.Body)
			case c.Error != nil:
				k.Message = firstNonEmpty(c.Error.Message, c.Error.Body)
			case c.Skipped != nil:
				k.Message = c.Skipped.Message
			}
			if k.Status == "" {
				k.Status = "passed"
				if c.Failure != nil || c.Error != nil {
					k.Status = "failed"
				} else if c.Skipped != nil {
					k.Status = "skipped"
				}
			}
			out = append(out, k)
		}
	}
	return out, nil
}

func hasSIGLabel(list string) bool {
	for _, l := range strings.Split(list, ",") {
		if strings.HasPrefix(strings.TrimSpace(l), "sig-") {
			return true
		}
	}
	return false
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if strings.TrimSpace(x) != "" {
			return strings.TrimSpace(x)
		}
	}
	return ""
}
