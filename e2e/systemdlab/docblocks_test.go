package systemdlab

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDocBlocks(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		want    map[string]string
		wantErr string
	}{
		{
			name: "marked and unmarked blocks",
			doc:  "# T\n```sh\nnot me\n```\n<!-- lab:one -->\n```sh\necho 1\necho 2\n```\ntext\n<!-- lab:two -->\n```\nb\n```\n",
			want: map[string]string{"one": "echo 1\necho 2\n", "two": "b\n"},
		},
		{name: "no blocks", doc: "just text\n", want: map[string]string{}},
		{name: "marker without fence", doc: "<!-- lab:x -->\n\n```sh\na\n```\n", wantErr: "not followed by a fenced code block"},
		{name: "unclosed", doc: "<!-- lab:x -->\n```sh\na\n", wantErr: "not closed"},
		{name: "duplicate", doc: "<!-- lab:x -->\n```\na\n```\n<!-- lab:x -->\n```\nb\n```\n", wantErr: "marked twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DocBlocks(tt.doc)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("blocks (-want +got):\n%s", diff)
			}
		})
	}
}

// TestInstallGuideBlocks checks that docs/INSTALL.md has the blocks the lab runs, and that they do what the
// lab's checks assume: a guide edit that drops a step fails here, without root.
func TestInstallGuideBlocks(t *testing.T) {
	b, err := os.ReadFile("../../docs/INSTALL.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := DocBlocks(string(b))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"install":     {"/usr/local/bin/kube-proxy", "/etc/systemd/system/kube-proxy.service"},
		"config":      {"/var/lib/kube-proxy/kubeconfig", "/var/lib/kube-proxy/kube-proxy-config.yaml"},
		"start":       {"systemctl daemon-reload", "systemctl enable --now kube-proxy"},
		"switch":      {"kube-proxy.upstream", "systemctl start kube-proxy"},
		"switch-back": {"kube-proxy.upstream", "systemctl start kube-proxy"},
		"uninstall":   {"kube-proxy --cleanup", "systemctl disable --now kube-proxy"},
	}
	for name, needles := range want {
		body, ok := blocks[name]
		if !ok {
			t.Errorf("docs/INSTALL.md has no <!-- lab:%s --> block", name)
			continue
		}
		for _, n := range needles {
			if !strings.Contains(body, n) {
				t.Errorf("block lab:%s does not mention %q:\n%s", name, n, body)
			}
		}
	}
}
