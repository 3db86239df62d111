package images

import (
	"archive/tar"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestParseProjectDockerfile reads the project's own Dockerfile: the lab's kube-proxy image is what it
// says, and a new instruction there that the lab does not understand fails here first.
func TestParseProjectDockerfile(t *testing.T) {
	text, err := os.ReadFile("../../../packaging/container/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	ctxDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(ctxDir, "kube-proxy-linux-amd64"), []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := ParseDockerfile(string(text), ctxDir, map[string]string{"TARGETARCH": "amd64"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Rootfs.Suite != "bookworm" {
		t.Errorf("suite %q, want bookworm", d.Rootfs.Suite)
	}
	for _, want := range []string{"iptables", "nftables", "conntrack"} {
		if !contains(d.Rootfs.Packages, want) {
			t.Errorf("packages %v lack %s", d.Rootfs.Packages, want)
		}
	}
	if len(d.Files) != 1 || d.Files[0].Dst != "/usr/local/bin/kube-proxy" || d.Files[0].Mode != 0o755 {
		t.Errorf("files %+v, want the binary at /usr/local/bin/kube-proxy, mode 0755", d.Files)
	}
	if !reflect.DeepEqual(d.Entrypoint, []string{"/usr/local/bin/kube-proxy"}) {
		t.Errorf("entrypoint %q", d.Entrypoint)
	}
}

func TestParseDockerfileRefusesWhatItDoesNotKnow(t *testing.T) {
	ctxDir := t.TempDir()
	for _, tt := range []struct{ name, text, want string }{
		{"alpine base", "FROM alpine:3\n", "line 1: FROM alpine:3"},
		{"curl in RUN", "FROM debian:bookworm\nRUN apt-get update && curl -o /x http://x\n", `line 2: RUN command "curl -o /x http://x"`},
		{"continued RUN", "FROM debian:bookworm\n\nRUN apt-get update \\\n && apt-get install --reinstall x\n", "line 3: apt-get install option --reinstall"},
		{"undeclared arg", "FROM debian:bookworm\nCOPY a-${ARCH} /a\n", "line 2: build argument ARCH"},
		{"shell entrypoint", "FROM debian:bookworm\nENTRYPOINT /bin/x\n", "line 2: ENTRYPOINT must be in exec form"},
		{"USER", "FROM debian:bookworm\nUSER nobody\n", "line 2: instruction USER"},
		{"missing source", "FROM debian:bookworm\nCOPY nothere /x\n", "line 2: COPY source"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseDockerfile(tt.text, ctxDir, map[string]string{"TARGETARCH": "amd64"})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestWriteArchive writes an image of a small tree and a file, and reads the archive back as a runtime
// would: manifest, configuration, and each layer under the digest the configuration names.
func TestWriteArchive(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("GNU tar not installed")
	}
	root := t.TempDir()
	mustWrite(t, filepath.Join(root, "bin/sh"), "shell", 0o755)
	mustWrite(t, filepath.Join(root, readyMark), "k", 0o644)
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(root, "dev/null-ish"), "x", 0o644)
	bin := filepath.Join(t.TempDir(), "agnhost")
	mustWrite(t, bin, "agnhost binary", 0o755)

	work := t.TempDir()
	out := filepath.Join(work, "img.tar")
	img := Image{Tags: []string{"registry.example/e2e/agnhost:1.0"}, Rootfs: root,
		Files: []File{{Src: bin, Dst: "/agnhost", Mode: 0o755}}, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}}
	if err := WriteArchive(context.Background(), out, work, img); err != nil {
		t.Fatal(err)
	}
	entries := readTar(t, out)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(entries["manifest.json"], &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest) != 1 || !reflect.DeepEqual(manifest[0].RepoTags, img.Tags) || len(manifest[0].Layers) != 2 {
		t.Fatalf("manifest %+v", manifest)
	}
	var cfg struct {
		Config struct{ Entrypoint, Cmd []string }
		Rootfs struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	if err := json.Unmarshal(entries[manifest[0].Config], &cfg); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Config.Entrypoint, img.Entrypoint) || !reflect.DeepEqual(cfg.Config.Cmd, img.Cmd) {
		t.Errorf("config %+v", cfg.Config)
	}
	for i, l := range manifest[0].Layers {
		if "sha256:"+strings.TrimSuffix(l, "/layer.tar") != cfg.Rootfs.DiffIDs[i] {
			t.Errorf("layer %s is not diff id %s", l, cfg.Rootfs.DiffIDs[i])
		}
	}
	base := readTarBytes(t, entries[manifest[0].Layers[0]])
	if string(base["bin/sh"]) != "shell" {
		t.Errorf("base layer has %v, want bin/sh", keys(base))
	}
	for name := range base {
		if strings.HasPrefix(name, "dev/") && name != "dev/" || strings.Contains(name, readyMark) {
			t.Errorf("base layer holds %s", name)
		}
	}
	top := readTarBytes(t, entries[manifest[0].Layers[1]])
	if string(top["agnhost"]) != "agnhost binary" {
		t.Errorf("file layer has %v, want agnhost", keys(top))
	}

	// Two images over one tree in one archive: the tree's layer is stored once, named by both.
	out2 := filepath.Join(work, "img2.tar")
	if err := WriteArchive(context.Background(), out2, work, img, Image{Tags: []string{"x/pause:1"}, Rootfs: root}); err != nil {
		t.Fatal(err)
	}
	entries2 := readTar(t, out2)
	if err := json.Unmarshal(entries2["manifest.json"], &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest) != 2 || manifest[1].Layers[0] != manifest[0].Layers[0] {
		t.Fatalf("manifest %+v: want two images on one base layer", manifest)
	}
	if manifest[0].Layers[0] != strings.TrimPrefix(cfg.Rootfs.DiffIDs[0], "sha256:")+"/layer.tar" {
		t.Errorf("the same tree gave another base layer: %s", manifest[0].Layers[0])
	}
	layerFiles := 0
	for name := range entries2 {
		if strings.HasSuffix(name, "/layer.tar") {
			layerFiles++
		}
	}
	if layerFiles != 2 {
		t.Errorf("archive holds %d layers, want 2 (the shared tree once, the files once)", layerFiles)
	}
}

func mustWrite(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func readTar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return readTarBytes(t, b)
}

func readTarBytes(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(strings.NewReader(string(b)))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(h.Name, "./")] = data
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
