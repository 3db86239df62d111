package config

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.yaml.in/yaml/v3"
)

const exampleFile = "../kube-proxy-config.example.yaml"

// TestExampleLoads: the shipped example is valid and, apart from the two
// values it sets on purpose, documents the defaults truthfully.
func TestExampleLoads(t *testing.T) {
	c, err := Load(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.ClientConnection.Kubeconfig = "/var/lib/kube-proxy/kubeconfig"
	want.Mode = ModeIPTables
	if diff := cmp.Diff(want, c, cmpOpts, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("example differs from the defaults (-defaults +example):\n%s", diff)
	}
}

// TestExampleCoversEveryField walks the struct tree: every JSON field must
// appear in the example, in upstream's (the struct's) order, with a comment;
// leaf fields' comments must give the default. A field added to the types
// without an example fails here.
func TestExampleCoversEveryField(t *testing.T) {
	data, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := parseNodes(data)
	if err != nil {
		t.Fatal(err)
	}
	checkExampleMapping(t, string(data), doc.Content[0], reflect.TypeFor[KubeProxyConfiguration](), "")
}

func checkExampleMapping(t *testing.T, text string, n *yaml.Node, typ reflect.Type, path string) {
	t.Helper()
	if n.Kind != yaml.MappingNode {
		t.Errorf("%s: not a mapping in the example", path)
		return
	}
	keys := map[string]int{} // key -> position
	for i := 0; i+1 < len(n.Content); i += 2 {
		keys[n.Content[i].Value] = i
	}
	last := -1
	for _, f := range jsonFields(typ) {
		p := joinPath(path, f.name)
		i, ok := keys[f.name]
		if !ok {
			t.Errorf("field %s is missing from %s", p, exampleFile)
			continue
		}
		if p == "apiVersion" || p == "kind" {
			// TypeMeta declares kind first; files conventionally start
			// with apiVersion. Either way they come before the rest.
			last = max(last, i)
		} else if i < last {
			t.Errorf("field %s is out of upstream's order in %s", p, exampleFile)
		} else {
			last = i
		}
		k, v := n.Content[i], n.Content[i+1]
		ft := typ.FieldByIndex(f.index).Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct && !isLeafType(ft):
			checkExampleMapping(t, text, v, ft, p)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			// A list of structs is empty by default: its element fields
			// must at least be shown in the comment.
			for _, ef := range jsonFields(ft.Elem()) {
				if !strings.Contains(k.HeadComment, ef.name+":") {
					t.Errorf("field %s[].%s is not shown in the comment of %s", p, ef.name, p)
				}
			}
			fallthrough
		default:
			comment := k.HeadComment + k.LineComment
			if comment == "" {
				t.Errorf("field %s has no comment in %s", p, exampleFile)
			} else if p != "apiVersion" && p != "kind" && !strings.Contains(comment, "Default") {
				t.Errorf("the comment of %s does not give its default: %q", p, comment)
			}
		}
	}
}
