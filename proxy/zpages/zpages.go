// Package zpages serves upstream's status pages, /flagz and /statusz (the ComponentFlagz and
// ComponentStatusz features), in the formats of Kubernetes v1.37: the text page for people, with its
// warning header and a separator picked at random so that no script comes to depend on it, and the
// structured Flagz and Statusz objects of config.k8s.io v1beta1 (and the deprecated v1alpha1) for an
// Accept header that asks for one by name (application/json;as=Flagz;v=v1beta1;g=config.k8s.io, or
// application/yaml), negotiated as upstream negotiates them.
//
// Upstream's handlers live in k8s.io/apiserver (pkg/server/flagz and statusz), which brings the API
// server's request handling, metrics and feature gates with it; the formats are small enough to write here.
// Upstream serves CBOR too when the CBORServingAndStorage gate (alpha, off) is on; this does not.
package zpages

import (
	"encoding/json"
	"fmt"
	"html"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/munnerz/goautoneg"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Group is the API group of the structured pages.
const Group = "config.k8s.io"

// versions are the structured pages' versions, each with whether it is deprecated.
var versions = map[string]bool{"v1alpha1": true, "v1beta1": false}

// delimiters are the separators a text page picks from, upstream's.
var delimiters = []string{":", ": ", "=", " "}

// pickDelimiter picks a text page's separator; tests fix it.
var pickDelimiter = func() string { return delimiters[rand.IntN(len(delimiters))] }

// header opens every text page, as upstream's.
const header = "\n%s %s\nWarning: This endpoint is not meant to be machine parseable, has no formatting compatibility " +
	"guarantees and is for debugging purposes only.\n"

// Flagz is the structured /flagz page.
type Flagz struct {
	metav1.TypeMeta   `json:""`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// Flags maps each command-line flag to its value.
	Flags map[string]string `json:"flags,omitempty"`
}

// Statusz is the structured /statusz page.
type Statusz struct {
	metav1.TypeMeta   `json:""`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// StartTime is when the process started.
	StartTime metav1.Time `json:"startTime"`
	// UptimeSeconds is how long it has run.
	UptimeSeconds int64 `json:"uptimeSeconds"`
	// GoVersion is the Go release the binary was built with.
	GoVersion string `json:"goVersion"`
	// BinaryVersion is the Kubernetes version of the binary.
	BinaryVersion string `json:"binaryVersion"`
	// EmulationVersion is the Kubernetes version whose behaviour the binary has.
	EmulationVersion string `json:"emulationVersion,omitempty"`
	// Paths are the top-level paths the server serves.
	Paths []string `json:"paths"`
}

// FlagzHandler serves /flagz for component: the flags flags returns (name to value), read once, at the
// first request, as upstream caches its text page.
func FlagzHandler(component string, flags func() map[string]string) http.Handler {
	var (
		once sync.Once
		got  map[string]string
		text []byte
	)
	read := func() {
		once.Do(func() {
			got = flags()
			text = flagzText(component, got, pickDelimiter())
		})
	}
	return &page{name: "flagz", kind: "Flagz",
		text: func() []byte { read(); return text },
		object: func(version string) any {
			read()
			return &Flagz{TypeMeta: typeMeta("Flagz", version), ObjectMeta: metav1.ObjectMeta{Name: component}, Flags: got}
		}}
}

// flagzText is the text page of flags, sorted by name, each as name, delim, value.
func flagzText(component string, flags map[string]string, delim string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, header, component, "flagz")
	names := make([]string, 0, len(flags))
	for n := range flags {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b.WriteString(n + delim + flags[n] + "\n")
	}
	return []byte(b.String())
}

// Status is what /statusz reports.
type Status struct {
	// Start is when the process started.
	Start time.Time
	// BinaryVersion and EmulationVersion are Kubernetes versions, "1.37.2" and "1.37".
	BinaryVersion, EmulationVersion string
	// GoVersion is the Go release the binary was built with.
	GoVersion string
	// Paths are the paths the server serves; the page lists their first segments.
	Paths []string
}

// StatuszHandler serves /statusz for component.
func StatuszHandler(component string, st Status, now func() time.Time) http.Handler {
	paths := topLevel(st.Paths)
	object := func(version string) *Statusz {
		return &Statusz{
			TypeMeta:         typeMeta("Statusz", version),
			ObjectMeta:       metav1.ObjectMeta{Name: component},
			StartTime:        metav1.Time{Time: st.Start},
			UptimeSeconds:    max(0, int64(now().Sub(st.Start).Seconds())),
			GoVersion:        st.GoVersion,
			BinaryVersion:    st.BinaryVersion,
			EmulationVersion: st.EmulationVersion,
			Paths:            paths,
		}
	}
	return &page{name: "statusz", kind: "Statusz",
		text: func() []byte {
			return statuszText(component, object("v1beta1"), now(), pickDelimiter())
		},
		object: func(version string) any { return object(version) }}
}

// statuszText is the text page of s, upstream's lines with delim after each label.
func statuszText(component string, s *Statusz, now time.Time, delim string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, header, component, "statusz")
	d := html.EscapeString(delim)
	up := max(0, int64(now.Sub(s.StartTime.Time).Seconds()))
	var emulation, paths string
	if s.EmulationVersion != "" {
		emulation = "Emulation version" + d + " " + html.EscapeString(s.EmulationVersion)
	}
	if len(s.Paths) > 0 {
		paths = "Paths" + d + " " + html.EscapeString(strings.Join(s.Paths, " "))
	}
	for _, line := range []string{
		"",
		"Started" + d + " " + html.EscapeString(s.StartTime.Time.Format(time.UnixDate)),
		"Up" + d + " " + html.EscapeString(fmt.Sprintf("%d hr %02d min %02d sec", up/3600, (up/60)%60, up%60)),
		"Go version" + d + " " + html.EscapeString(s.GoVersion),
		"Binary version" + d + " " + html.EscapeString(s.BinaryVersion),
		emulation,
		paths,
	} {
		b.WriteString(line + "\n")
	}
	return []byte(b.String())
}

// hiddenPaths are the API server's paths that upstream's /statusz never lists.
var hiddenPaths = map[string]bool{"/api": true, "/apis": true, "/openid": true, "/openapi": true, "/.well-known": true}

// topLevel returns the distinct first segments of paths ("/metrics/slis" gives "/metrics"), sorted.
func topLevel(paths []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range paths {
		parts := strings.Split(p, "/")
		if len(parts) < 2 || parts[1] == "" {
			continue
		}
		if top := "/" + parts[1]; !seen[top] && !hiddenPaths[top] {
			seen[top] = true
			out = append(out, top)
		}
	}
	sort.Strings(out)
	return out
}

func typeMeta(kind, version string) metav1.TypeMeta {
	return metav1.TypeMeta{Kind: kind, APIVersion: Group + "/" + version}
}

// page is one status page in its text and structured forms.
type page struct {
	name, kind string
	text       func() []byte
	object     func(version string) any
}

// The media types a page is served in, in upstream's order of preference for a wildcard.
const (
	mediaJSON = "application/json"
	mediaYAML = "application/yaml"
	mediaText = "text/plain"
)

var mediaTypes = []string{mediaJSON, mediaYAML, mediaText}

// choice is the outcome of content negotiation.
type choice struct {
	mediaType string
	version   string // of the structured page; "" for text
	pretty    bool
}

func (p *page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.TrimSpace(r.Header.Get("Accept")) == "" {
		writeText(w, p.text())
		return
	}
	c, ok := negotiate(r, func(mediaType string, gvk *metav1.GroupVersionKind) bool {
		if mediaType == mediaText {
			return gvk == nil
		}
		if gvk == nil {
			return false
		}
		_, known := versions[gvk.Version]
		return gvk.Group == Group && gvk.Kind == p.kind && known
	})
	if !ok {
		notAcceptable(w, r)
		return
	}
	if c.mediaType == mediaText {
		writeText(w, p.text())
		return
	}
	if versions[c.version] {
		w.Header().Set("Warning", `299 - "This version of the `+p.name+` endpoint is deprecated. Please use a newer version."`)
	}
	body, err := encode(p.object(c.version), c.mediaType, c.pretty)
	if err != nil {
		http.Error(w, fmt.Sprintf("encoding %s: %v", p.name, err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", c.mediaType+";g="+Group+";v="+c.version+";as="+p.kind)
	_, _ = w.Write(body)
}

func writeText(w http.ResponseWriter, text []byte) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write(text)
}

// negotiate picks what to answer r's Accept header with, as the API server does: the clauses in order of
// preference, each matched against the media types in order; a clause's as, g and v parameters name a
// structured page, which allowed must accept; one that asks for a stream or a server version is refused.
func negotiate(r *http.Request, allowed func(mediaType string, gvk *metav1.GroupVersionKind) bool) (choice, bool) {
	for _, clause := range goautoneg.ParseAccept(r.Header.Get("Accept")) {
		for _, mt := range mediaTypes {
			typ, sub, _ := strings.Cut(mt, "/")
			if !(clause.Type == typ && (clause.SubType == sub || clause.SubType == "*")) && !(clause.Type == "*" && clause.SubType == "*") {
				continue
			}
			c := choice{mediaType: mt, pretty: prettyRequested(r)}
			var gvk *metav1.GroupVersionKind
			refused := false
			for k, v := range clause.Params {
				switch k {
				case "as", "g", "v":
					if gvk == nil {
						gvk = &metav1.GroupVersionKind{}
					}
					switch k {
					case "as":
						gvk.Kind = v
					case "g":
						gvk.Group = v
					case "v":
						gvk.Version = v
					}
				case "stream", "sv":
					refused = refused || v != ""
				case "pretty":
					c.pretty = c.pretty || v == "1"
				}
			}
			if refused || !allowed(mt, gvk) {
				continue
			}
			if gvk != nil {
				c.version = gvk.Version
			}
			return c, true
		}
	}
	return choice{}, false
}

// prettyRequested is the API server's rule: ?pretty=true, or a client that a person runs.
func prettyRequested(r *http.Request) bool {
	if strings.Contains(r.URL.RawQuery, "pretty") {
		if v := r.URL.Query().Get("pretty"); v != "" {
			b, _ := strconv.ParseBool(v)
			return b
		}
	}
	ua := r.UserAgent()
	return strings.HasPrefix(ua, "curl") || strings.HasPrefix(ua, "Wget") || strings.HasPrefix(ua, "Mozilla/5.0")
}

// encode writes v as the API server's JSON (indented when pretty) or YAML serializer writes it.
func encode(v any, mediaType string, pretty bool) ([]byte, error) {
	switch {
	case mediaType == mediaYAML:
		j, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		return yaml.JSONToYAML(j)
	case pretty:
		return json.MarshalIndent(v, "", "  ")
	default:
		b, err := json.Marshal(v)
		return append(b, '\n'), err
	}
}

// notAcceptable answers a request no page form suits with the API server's 406 Status: in JSON or YAML
// as the Accept header allows, else in indented JSON, as the API server writes an error it cannot
// negotiate.
func notAcceptable(w http.ResponseWriter, r *http.Request) {
	status := &metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  "only the following media types are accepted: " + strings.Join(mediaTypes, ", "),
		Reason:   metav1.StatusReasonNotAcceptable,
		Code:     http.StatusNotAcceptable,
	}
	c, ok := negotiate(r, func(mediaType string, gvk *metav1.GroupVersionKind) bool {
		return gvk == nil && mediaType != mediaText
	})
	var body []byte
	var err error
	if ok {
		body, err = encode(status, c.mediaType, c.pretty)
	} else {
		c.mediaType = mediaJSON
		body, err = json.MarshalIndent(status, "", "  ")
	}
	if err != nil {
		http.Error(w, status.Message, http.StatusNotAcceptable)
		return
	}
	w.Header().Set("Content-Type", c.mediaType)
	w.WriteHeader(http.StatusNotAcceptable)
	_, _ = w.Write(body)
}
