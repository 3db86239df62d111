package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// FieldError is one problem found in a configuration. File and Line are set
// when the problem comes from a file and its position is known; Field is the
// JSON path of the field ("iptables.minSyncPeriod", "nodePortAddresses[1]"),
// empty for problems of the file as a whole.
type FieldError struct {
	File  string
	Line  int
	Field string
	Msg   string
}

// Error formats the error as "FILE:LINE: FIELD: MSG", leaving out the parts
// that are not known.
func (e *FieldError) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s:%d: ", e.File, e.Line)
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Load reads file and decodes it with Decode.
func Load(file string) (*KubeProxyConfiguration, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading kube-proxy config: %w", err)
	}
	return Decode(file, data)
}

// Decode parses data, the content of file (used in error messages only),
// strictly, applies the defaults and validates the result.
//
// Like upstream, the data must declare apiVersion
// kubeproxy.config.k8s.io/v1alpha1 and kind KubeProxyConfiguration, so an
// empty file is an error. Values are read with upstream's YAML 1.1 rules (so
// "masqueradeAll: yes" is true), field names are case-sensitive, and an
// unknown or repeated field is an error (upstream only warns about those; a
// mistyped field silently doing nothing is worse for a node daemon). The
// exceptions are the fields older v1alpha1 releases had (removedFields), which
// upstream still loads and ignores: they are ignored here too, with a warning.
// JSON is accepted too. The returned error joins one *FieldError per problem.
//
// Decode drops the warnings (ignored fields, GA or deprecated feature gates);
// Options.Complete returns them.
func Decode(file string, data []byte) (*KubeProxyConfiguration, error) {
	c, _, err := decodeFile(file, data)
	return c, err
}

// decodeFile is Decode that also returns the warnings, each a *FieldError
// with file and line.
func decodeFile(file string, data []byte) (*KubeProxyConfiguration, []*FieldError, error) {
	c, lines, errs, warns := decode(file, data)
	if len(errs) == 0 {
		var more []*FieldError
		errs, more = c.validate()
		warns = append(warns, more...)
		for _, e := range append(errs, more...) {
			e.File = file
			e.Line = lines.lineFor(e.Field)
		}
	}
	if len(errs) > 0 {
		return nil, nil, joinFieldErrors(errs)
	}
	return c, warns, nil
}

// Marshal encodes c as YAML with apiVersion and kind, in the form
// --write-config-to writes and Decode reads back.
func Marshal(c *KubeProxyConfiguration) ([]byte, error) {
	out := *c
	out.APIVersion = APIVersion
	out.Kind = Kind
	b, err := sigsyaml.Marshal(&out)
	if err != nil {
		return nil, fmt.Errorf("encoding kube-proxy config: %w", err)
	}
	return b, nil
}

func joinFieldErrors(errs []*FieldError) error {
	all := make([]error, len(errs))
	for i, e := range errs {
		all[i] = e
	}
	return errors.Join(all...)
}

// lineIndex maps JSON field paths to the line of their key in the file.
type lineIndex map[string]int

// lineFor returns the line of path, or of a closely related field (the other
// sync period, detectLocalMode for detectLocal.*), or of the nearest ancestor
// present in the file; 0 when nothing is known.
func (ix lineIndex) lineFor(path string) int {
	if l, ok := ix[path]; ok {
		return l
	}
	for _, alt := range relatedFields(path) {
		if l, ok := ix[alt]; ok {
			return l
		}
	}
	for p := parentPath(path); p != ""; p = parentPath(p) {
		if l, ok := ix[p]; ok {
			return l
		}
	}
	return 0
}

func relatedFields(path string) []string {
	parent, leaf := splitLast(path)
	switch {
	case leaf == "minSyncPeriod":
		return []string{joinPath(parent, "syncPeriod")}
	case leaf == "syncPeriod":
		return []string{joinPath(parent, "minSyncPeriod")}
	case parent == "detectLocal":
		return []string{"detectLocalMode"}
	}
	return nil
}

func parentPath(p string) string {
	parent, _ := splitLast(p)
	return parent
}

// splitLast splits "a.b[2]" into "a.b" and "[2]", and "a.b" into "a" and "b".
func splitLast(p string) (parent, leaf string) {
	if strings.HasSuffix(p, "]") {
		if i := strings.LastIndex(p, "["); i >= 0 {
			return p[:i], p[i:]
		}
	}
	if i := strings.LastIndex(p, "."); i >= 0 {
		return p[:i], p[i+1:]
	}
	return "", p
}

func joinPath(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

func indexPath(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}

// decode parses and defaults without validating. It returns the line index
// for error positions, the problems found and the warnings about ignored
// fields.
func decode(file string, data []byte) (c *KubeProxyConfiguration, lines lineIndex, errs, warns []*FieldError) {
	fail := func(line int, field, msg string) (*KubeProxyConfiguration, lineIndex, []*FieldError, []*FieldError) {
		return nil, nil, []*FieldError{{File: file, Line: line, Field: field, Msg: msg}}, nil
	}

	// The node tree gives line numbers, syntax errors with positions,
	// duplicate keys and multi-document detection.
	doc, err := parseNodes(data)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return fail(0, "", "the file is empty; it must at least set apiVersion: "+APIVersion+" and kind: "+Kind)
		}
		return fail(yamlErrorLine(err), "", "invalid YAML: "+trimYAMLError(err))
	}
	ix := &indexer{lines: lineIndex{}, budget: maxNodeVisits}
	ix.walk(doc, "")
	for i := range ix.errs {
		ix.errs[i].File = file
	}
	if len(ix.errs) > 0 {
		return nil, nil, ix.errs, nil
	}

	// Values are read the way upstream reads them: YAML (1.1, via the same
	// library upstream uses) converted to JSON, then decoded field by field
	// with encoding/json.
	root, err := yamlToJSONValue(data)
	if err != nil {
		return fail(yamlErrorLine(err), "", "invalid YAML: "+trimYAMLError(err))
	}
	if root == nil {
		return fail(0, "", "the file has no content; it must at least set apiVersion: "+APIVersion+" and kind: "+Kind)
	}
	top, ok := root.(map[string]any)
	if !ok {
		return fail(1, "", fmt.Sprintf("the top level must be a mapping with apiVersion: %s and kind: %s, got %s", APIVersion, Kind, describeJSON(root)))
	}

	want := fmt.Sprintf("want apiVersion: %s with kind: %s", APIVersion, Kind)
	for _, tm := range []struct{ field, value string }{{"apiVersion", APIVersion}, {"kind", Kind}} {
		v, present := top[tm.field]
		switch {
		case !present || v == nil:
			errs = append(errs, &FieldError{File: file, Line: ix.lines.lineFor(tm.field), Field: tm.field, Msg: "missing; " + want})
		case v != tm.value:
			errs = append(errs, &FieldError{File: file, Line: ix.lines.lineFor(tm.field), Field: tm.field, Msg: fmt.Sprintf("%s is not supported; %s", describeJSON(v), want)})
		}
	}
	if len(errs) > 0 {
		return nil, nil, errs, nil
	}

	c = &KubeProxyConfiguration{}
	w := &walker{lines: ix.lines}
	w.value(top, reflect.ValueOf(c).Elem(), "")
	for _, e := range append(w.errs, w.warns...) {
		e.File = file
	}
	if len(w.errs) > 0 {
		return nil, nil, w.errs, nil
	}
	SetDefaults(c)
	return c, ix.lines, nil, w.warns
}

// parseNodes parses the first YAML document into a node tree and rejects a
// second one. It returns io.EOF for a file without any document.
func parseNodes(data []byte) (doc *yaml.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			doc, err = nil, fmt.Errorf("yaml: parser failed: %v", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var n yaml.Node
	if err := dec.Decode(&n); err != nil {
		return nil, err
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		return nil, fmt.Errorf("yaml: line %d: a second YAML document starts here; the file must hold exactly one KubeProxyConfiguration", extra.Line)
	case !errors.Is(err, io.EOF):
		return nil, err
	}
	return &n, nil
}

func yamlToJSONValue(data []byte) (v any, err error) {
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("yaml: parser failed: %v", r)
		}
	}()
	j, err := sigsyaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

var yamlLineRE = regexp.MustCompile(`line (\d+)`)

func yamlErrorLine(err error) int {
	m := yamlLineRE.FindStringSubmatch(err.Error())
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

var yamlPrefixRE = regexp.MustCompile(`^(error converting YAML to JSON: )?(yaml: )?(line \d+: )?`)

func trimYAMLError(err error) string {
	return yamlPrefixRE.ReplaceAllString(err.Error(), "")
}

// maxNodeVisits bounds the work of walking a node tree whose aliases expand
// exponentially ("billion laughs"); real configs visit a few hundred nodes.
const maxNodeVisits = 100000

// indexer walks the YAML node tree, recording the line of every field path
// and reporting duplicate keys.
type indexer struct {
	lines  lineIndex
	errs   []*FieldError
	budget int
}

func (ix *indexer) walk(n *yaml.Node, path string) {
	ix.budget--
	if ix.budget == 0 {
		ix.errs = append(ix.errs, &FieldError{Line: n.Line, Field: path, Msg: "too many nodes or alias expansions"})
	}
	if ix.budget <= 0 {
		return
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			ix.walk(c, path)
		}
	case yaml.AliasNode:
		if n.Alias != nil {
			ix.walk(n.Alias, path)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := indexPath(path, i)
			if _, ok := ix.lines[p]; !ok {
				ix.lines[p] = c.Line
			}
			ix.walk(c, p)
		}
	case yaml.MappingNode:
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind == yaml.AliasNode && k.Alias != nil {
				k = k.Alias
			}
			if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
				// "<<: *anchor" merges the anchored mapping(s) here.
				ix.walk(v, path)
				continue
			}
			name := k.Value
			p := joinPath(path, name)
			if first, dup := seen[name]; dup {
				ix.errs = append(ix.errs, &FieldError{Line: n.Content[i].Line, Field: p, Msg: fmt.Sprintf("duplicate field (first set on line %d)", first)})
				continue
			}
			seen[name] = n.Content[i].Line
			if _, ok := ix.lines[p]; !ok {
				ix.lines[p] = n.Content[i].Line
			}
			ix.walk(v, p)
		}
	}
}

var jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// isLeafType reports whether values of t decode themselves (durations,
// quantities) rather than field by field.
func isLeafType(t reflect.Type) bool {
	return reflect.PointerTo(t).Implements(jsonUnmarshalerType)
}

// jsonField is one JSON-visible field of a struct, embedded fields flattened.
type jsonField struct {
	name      string
	index     []int
	omitEmpty bool
}

// jsonFields lists the fields of struct type t as encoding/json sees them.
func jsonFields(t reflect.Type) []jsonField {
	var out []jsonField
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if sf.Anonymous && name == "" && sf.Type.Kind() == reflect.Struct {
			for _, f := range jsonFields(sf.Type) {
				f.index = append([]int{i}, f.index...)
				out = append(out, f)
			}
			continue
		}
		if name == "" {
			name = sf.Name
		}
		out = append(out, jsonField{name: name, index: []int{i}, omitEmpty: strings.Contains(opts, "omitempty")})
	}
	return out
}

// walker decodes the JSON form of the document into the typed configuration,
// one field at a time, so that every problem carries its field path.
type walker struct {
	lines lineIndex
	errs  []*FieldError
	warns []*FieldError
}

func (w *walker) fail(path, msg string) {
	w.errs = append(w.errs, &FieldError{Line: w.lines.lineFor(path), Field: path, Msg: msg})
}

func (w *walker) warn(path, msg string) {
	w.warns = append(w.warns, &FieldError{Line: w.lines.lineFor(path), Field: path, Msg: msg})
}

// sortedKeys returns the keys of m in the order they appear in the file.
func (w *walker) sortedKeys(m map[string]any, path string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		li, lj := w.lines[joinPath(path, keys[i])], w.lines[joinPath(path, keys[j])]
		if li != lj {
			return li < lj
		}
		return keys[i] < keys[j]
	})
	return keys
}

func (w *walker) value(j any, v reflect.Value, path string) {
	if j == nil {
		// null leaves the field unset, as encoding/json does.
		v.Set(reflect.Zero(v.Type()))
		return
	}
	t := v.Type()
	if t.Kind() == reflect.Pointer {
		p := reflect.New(t.Elem())
		w.value(j, p.Elem(), path)
		v.Set(p)
		return
	}
	if isLeafType(t) {
		w.leaf(j, v, path)
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := j.(map[string]any)
		if !ok {
			w.fail(path, fmt.Sprintf("got %s, want a mapping", describeJSON(j)))
			return
		}
		fields := jsonFields(t)
		for _, k := range w.sortedKeys(m, path) {
			p := joinPath(path, k)
			f, ok := findField(fields, k)
			if !ok {
				if why, removed := removedFields[p]; removed {
					// Not decoded: upstream does not read the value either.
					w.warn(p, "ignored: "+why)
					continue
				}
				w.fail(p, unknownFieldMsg(fields, k, path))
				continue
			}
			w.value(m[k], v.FieldByIndex(f.index), p)
		}
	case reflect.Map:
		m, ok := j.(map[string]any)
		if !ok {
			msg := fmt.Sprintf("got %s, want a mapping", describeJSON(j))
			if _, isString := j.(string); isString && path == "featureGates" {
				// kube-proxy 1.9 and 1.10 wrote the gates as one string; upstream refuses that too.
				msg += " of gate names to true or false, such as {NFTablesProxyMode: true} (the comma-separated string is the format of v1.10 and older)"
			}
			w.fail(path, msg)
			return
		}
		out := reflect.MakeMapWithSize(t, len(m))
		for _, k := range w.sortedKeys(m, path) {
			p := joinPath(path, k)
			if k == "" {
				w.fail(p, "empty key")
				continue
			}
			e := reflect.New(t.Elem()).Elem()
			w.value(m[k], e, p)
			out.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), e)
		}
		v.Set(out)
	case reflect.Slice:
		list, ok := j.([]any)
		if !ok {
			w.fail(path, fmt.Sprintf("got %s, want a list", describeJSON(j)))
			return
		}
		out := reflect.MakeSlice(t, len(list), len(list))
		for i, e := range list {
			w.value(e, out.Index(i), indexPath(path, i))
		}
		v.Set(out)
	default:
		w.leaf(j, v, path)
	}
}

func findField(fields []jsonField, name string) (jsonField, bool) {
	for _, f := range fields {
		if f.name == name {
			return f, true
		}
	}
	return jsonField{}, false
}

// removedFields are the fields that earlier releases of
// kubeproxy.config.k8s.io/v1alpha1 had and that upstream v1.37 still loads
// (its lenient decoding drops every unknown field with a log line), keyed by
// JSON path, with why they are gone. They load here with a warning naming the
// field and its line, and their values are not read, as upstream's are not.
// A field that never existed stays an error.
var removedFields = map[string]string{
	"resourceContainer":      "removed in v1.16 (kube-proxy no longer moves itself into a container of its own)",
	"udpTimeoutMilliseconds": "the v1.9 name of udpIdleTimeout, which was removed in v1.26 with the userspace proxy mode",
	"conntrack.max":          "removed in v1.16; the limit is conntrack.maxPerCore times the number of CPUs, at least conntrack.min",
	// Not a field of any version: upstream added its lenient decoding so that
	// tools such as kustomize can give the object a name.
	"metadata": "KubeProxyConfiguration has no metadata; upstream ignores it so that tools such as kustomize can name the object",
}

// movedFields are fields of other kube-proxy config versions that people copy
// into v1alpha1 files, with where the setting lives in v1alpha1.
var movedFields = map[string]string{
	"syncPeriod":    "iptables.syncPeriod or ipvs.syncPeriod",
	"minSyncPeriod": "iptables.minSyncPeriod or ipvs.minSyncPeriod",
	"linux":         "the top-level oomScoreAdj and conntrack fields and iptables.masqueradeAll",
	"windows":       "windowsRunAsService",
}

func unknownFieldMsg(fields []jsonField, name, parent string) string {
	for _, f := range fields {
		if strings.EqualFold(f.name, name) {
			return fmt.Sprintf("unknown field (field names are case-sensitive: did you mean %q?)", f.name)
		}
	}
	if parent == "" {
		if where, ok := movedFields[name]; ok {
			return fmt.Sprintf("unknown field in %s; in this version the setting is %s", APIVersion, where)
		}
	}
	return "unknown field"
}

// leaf decodes a scalar (or a self-decoding value such as a duration) with
// encoding/json, as upstream does.
func (w *walker) leaf(j any, v reflect.Value, path string) {
	b, err := json.Marshal(j)
	if err == nil {
		err = json.Unmarshal(b, v.Addr().Interface())
	}
	if err != nil {
		w.fail(path, fmt.Sprintf("got %s, want %s", describeJSON(j), describeType(v.Type())))
	}
}

func describeJSON(j any) string {
	switch v := j.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return fmt.Sprintf("the string %q", v)
	case json.Number:
		return "the number " + v.String()
	case bool:
		return strconv.FormatBool(v)
	}
	return fmt.Sprintf("%v", j)
}

func describeType(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[metav1.Duration]():
		return `a duration such as "30s", "1m30s" or "500ms"`
	case reflect.TypeFor[TimeOrMetaDuration]():
		return `a duration such as "5s", or integer nanoseconds`
	case reflect.TypeFor[resource.QuantityValue]():
		return `a quantity such as "0", "512", "64Ki" or "1M"`
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Int:
		return fmt.Sprintf("an integer (%d-bit)", t.Bits())
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint:
		return fmt.Sprintf("a non-negative integer (%d-bit)", t.Bits())
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return t.String()
}
