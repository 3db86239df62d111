package zpages

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"kube-proxy/proxy/zpages/zpagestest"
)

// readUpstream returns a captured answer of upstream's (testdata/upstream/README.md).
func readUpstream(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "upstream", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// answer renders h's answer to a request in the captures' form.
func answer(h http.Handler, method, target, accept, userAgent string) string {
	r := httptest.NewRequest(method, target, nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	r.Header.Set("User-Agent", userAgent)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return zpagestest.Dump(w.Result())
}

// fixDelimiter makes text pages use delim for the test's duration.
func fixDelimiter(t *testing.T, delim string) {
	t.Helper()
	old := pickDelimiter
	pickDelimiter = func() string { return delim }
	t.Cleanup(func() { pickDelimiter = old })
}

// upstreamFlags are the flags upstream's /flagz showed in the captures.
func upstreamFlags(t *testing.T) map[string]string {
	t.Helper()
	capture := readUpstream(t, "flagz-json-beta")
	var f Flagz
	if err := json.Unmarshal([]byte(capture[strings.Index(capture, "{"):]), &f); err != nil {
		t.Fatal(err)
	}
	return f.Flags
}

// TestFlagzAsUpstream: given the flags upstream had, /flagz answers every form of request the way
// upstream v1.37.2 answered it, byte for byte: the text page, the structured page in each version and
// encoding (with the deprecation warning for v1alpha1), and the 406 Status for what it does not serve.
func TestFlagzAsUpstream(t *testing.T) {
	fixDelimiter(t, ": ") // the one upstream happened to pick
	h := FlagzHandler("kube-proxy", func() map[string]string { return upstreamFlags(t) })
	for _, tc := range []struct{ file, accept, ua string }{
		{"flagz-noaccept", "", "Go-http-client/1.1"},
		{"flagz-json-beta", "application/json;as=Flagz;v=v1beta1;g=config.k8s.io", "x"},
		{"flagz-json-alpha", "application/json;as=Flagz;v=v1alpha1;g=config.k8s.io", "x"},
		{"flagz-yaml-beta", "application/yaml;as=Flagz;v=v1beta1;g=config.k8s.io", "x"},
		{"flagz-json-plain", "application/json", ""},
		{"flagz-yaml-plain", "application/yaml", "x"},
		{"flagz-html", "text/html", "x"},
		{"flagz-json-wrongkind", "application/json;as=Statusz;v=v1beta1;g=config.k8s.io", "x"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			if diff := cmp.Diff(readUpstream(t, tc.file), answer(h, "GET", "/flagz", tc.accept, tc.ua)); diff != "" {
				t.Errorf("answer differs from upstream's (-upstream +ours):\n%s", diff)
			}
		})
	}
}

// TestStatuszAsUpstream: with upstream's start time, versions and paths, /statusz answers as upstream
// did, in text, JSON (compact, and indented for ?pretty=true) and YAML.
func TestStatuszAsUpstream(t *testing.T) {
	fixDelimiter(t, "=") // the one upstream happened to pick
	start := time.Date(2026, 12, 5, 8, 25, 32, 0, time.UTC)
	h := StatuszHandler("kube-proxy", Status{
		Start:            start,
		BinaryVersion:    "1.37.2",
		EmulationVersion: "1.37",
		GoVersion:        "go1.26.8",
		// What upstream's metrics port had installed before /statusz.
		Paths: []string{"/healthz", "/healthz/ping", "/metrics/slis", "/proxyMode", "/metrics", "/configz", "/flagz"},
	}, func() time.Time { return start.Add(3*time.Second + 400*time.Millisecond) })
	for _, tc := range []struct{ file, target, accept string }{
		{"statusz-noaccept", "/statusz", ""},
		{"statusz-json-beta", "/statusz", "application/json;as=Statusz;v=v1beta1;g=config.k8s.io"},
		{"statusz-json-alpha-pretty", "/statusz?pretty=true", "application/json;as=Statusz;v=v1alpha1;g=config.k8s.io"},
		{"statusz-yaml", "/statusz", "application/yaml;as=Statusz;v=v1beta1;g=config.k8s.io"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			if diff := cmp.Diff(readUpstream(t, tc.file), answer(h, "GET", tc.target, tc.accept, "x")); diff != "" {
				t.Errorf("answer differs from upstream's (-upstream +ours):\n%s", diff)
			}
		})
	}
}

// TestTextPagesPickADelimiter: the text pages use one of upstream's separators, the same on every line,
// and /flagz keeps the page it rendered first (upstream caches it), while /statusz renders each time.
func TestTextPagesPickADelimiter(t *testing.T) {
	calls := 0
	flagz := FlagzHandler("kube-proxy", func() map[string]string { calls++; return map[string]string{"a": "1", "b": "2"} })
	first := answer(flagz, "GET", "/flagz", "", "x")
	line := regexp.MustCompile(`(?m)^a(:|: |=| )1$`).FindStringSubmatch(first)
	if line == nil || !strings.Contains(first, "\nb"+line[1]+"2\n") {
		t.Fatalf("flagz text %q does not separate names and values with one of %q", first, delimiters)
	}
	for range 10 {
		if again := answer(flagz, "GET", "/flagz", "", "x"); again != first {
			t.Fatalf("flagz changed between requests:\n%s\n%s", first, again)
		}
	}
	if calls != 1 {
		t.Errorf("flags read %d times, want once", calls)
	}
	statusz := StatuszHandler("kube-proxy", Status{Start: time.Now(), BinaryVersion: "1.37.2", GoVersion: "go"}, time.Now)
	seen := map[string]bool{}
	for range 100 {
		m := regexp.MustCompile(`(?m)^Go version(:|: |=| ) go$`).FindStringSubmatch(answer(statusz, "GET", "/statusz", "", "x"))
		if m == nil {
			t.Fatal("statusz text without a Go version line")
		}
		seen[m[1]] = true
	}
	if len(seen) < 2 {
		t.Errorf("statusz used only %v in 100 renderings", seen)
	}
}

// TestNegotiation covers what the captures do not: wildcards, q-values, a clause the page refuses before
// one it takes, pretty from the Accept header or a person's client, and parameters that are refused.
func TestNegotiation(t *testing.T) {
	h := StatuszHandler("kube-proxy", Status{Start: time.Unix(0, 0).UTC(), BinaryVersion: "1.37.2"}, func() time.Time { return time.Unix(5, 0) })
	beta := "application/json;as=Statusz;v=v1beta1;g=config.k8s.io"
	for _, tc := range []struct {
		accept, ua, target string
		code               int
		contentType        string
		indented           bool
	}{
		{accept: "*/*", code: 200, contentType: "text/plain; charset=utf-8"},
		{accept: "text/*", code: 200, contentType: "text/plain; charset=utf-8"},
		{accept: "application/*", code: 406, contentType: "application/json"},
		{accept: "application/json, " + beta, code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Statusz"},
		{accept: "text/plain;q=0.5, " + beta, code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Statusz"},
		{accept: beta + ";pretty=1", code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Statusz", indented: true},
		{accept: beta, ua: "curl/8.5.0", code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Statusz", indented: true},
		{accept: beta, ua: "curl/8.5.0", target: "/statusz?pretty=false", code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Statusz"},
		{accept: beta + ";stream=watch", code: 406, contentType: "application/json"},
		{accept: "application/json;as=Statusz;v=v1beta1", code: 406, contentType: "application/json"},
		{accept: "application/json;as=Statusz;v=v1;g=config.k8s.io", code: 406, contentType: "application/json"},
		{accept: "text/plain;as=Statusz;v=v1beta1;g=config.k8s.io", code: 406, contentType: "application/json"},
	} {
		target := tc.target
		if target == "" {
			target = "/statusz"
		}
		r := httptest.NewRequest("GET", target, nil)
		r.Header.Set("Accept", tc.accept)
		r.Header.Set("User-Agent", tc.ua)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code || w.Header().Get("Content-Type") != tc.contentType {
			t.Errorf("Accept %q: %d %q, want %d %q", tc.accept, w.Code, w.Header().Get("Content-Type"), tc.code, tc.contentType)
		}
		if tc.code == 200 && strings.HasPrefix(tc.contentType, "application/json") && strings.Contains(w.Body.String(), "\n  ") != tc.indented {
			t.Errorf("Accept %q, User-Agent %q: indented %v, want %v:\n%s", tc.accept, tc.ua, !tc.indented, tc.indented, w.Body)
		}
	}
}
