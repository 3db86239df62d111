// Package images builds the container images the conformance lab runs, with no registry and no
// container engine: a Debian root file system from debootstrap (cached by its package list), files laid
// over it, and a docker-archive tarball that `ctr images import` takes.
//
// The agnhost image is upstream's test image rebuilt on Debian with the tools upstream's e2e tests call
// in exec pods; the kube-proxy image is packaging/container/Dockerfile, read and carried out (the
// subset of instructions it uses) instead of run by a container engine.
package images

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Rootfs is a Debian root file system built by debootstrap --variant=minbase.
type Rootfs struct {
	// Suite is the Debian release (bookworm).
	Suite string
	// Packages are installed on top of minbase.
	Packages []string
}

// readyMark names the file that marks a finished tree; it holds the tree's key.
const readyMark = ".kp-rootfs-ready"

// Key identifies the tree: the suite and the sorted package list.
func (r Rootfs) Key() string {
	pkgs := append([]string(nil), r.Packages...)
	sort.Strings(pkgs)
	return r.Suite + ":" + strings.Join(pkgs, ",")
}

// Dir is where the tree for r lives under cacheDir.
func (r Rootfs) Dir(cacheDir string) string {
	sum := sha256.Sum256([]byte(r.Key()))
	return filepath.Join(cacheDir, "rootfs-"+r.Suite+"-"+hex.EncodeToString(sum[:6]))
}

// Build returns the tree's directory, running debootstrap from mirror first unless a finished tree
// for the same key is there. The tree is built beside its final name and renamed when complete, so a
// run cut short leaves nothing that looks finished. logf receives progress lines.
func (r Rootfs) Build(ctx context.Context, cacheDir, mirror string, logf func(string, ...any)) (string, error) {
	dir := r.Dir(cacheDir)
	if b, err := os.ReadFile(filepath.Join(dir, readyMark)); err == nil && string(b) == r.Key() {
		return dir, nil
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "", errors.New("debootstrap is not installed (apt-get install debootstrap)")
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	logf("debootstrap %s with %s into %s", r.Suite, strings.Join(r.Packages, ","), dir)
	args := []string{"--variant=minbase"}
	if len(r.Packages) > 0 {
		args = append(args, "--include="+strings.Join(r.Packages, ","))
	}
	args = append(args, r.Suite, tmp, mirror)
	out, err := exec.CommandContext(ctx, "debootstrap", args...).CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(tmp)
		return "", fmt.Errorf("debootstrap %s: %w: %s", r.Suite, err, tail(string(out), 20))
	}
	// Downloaded packages are not part of the image.
	debs, _ := filepath.Glob(filepath.Join(tmp, "var/cache/apt/archives/*.deb"))
	for _, d := range debs {
		_ = os.Remove(d)
	}
	if err := os.WriteFile(filepath.Join(tmp, readyMark), []byte(r.Key()), 0o644); err != nil {
		return "", err
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	return dir, os.Rename(tmp, dir)
}

// File is a file laid over an image's root file system.
type File struct {
	// Src is the file on this machine.
	Src string
	// Dst is its absolute path in the image.
	Dst string
	// Mode is its permission bits.
	Mode os.FileMode
}

// Image is one image of a docker-archive tarball: a root file system directory (the first layer),
// files over it (the second layer), and the runtime configuration.
type Image struct {
	// Tags are the image's full references (registry/name:tag).
	Tags []string
	// Rootfs is a directory whose whole tree is the first layer ("" for none).
	Rootfs string
	// Files make the second layer.
	Files []File
	// Entrypoint and Cmd are the image's ENTRYPOINT and CMD.
	Entrypoint, Cmd []string
}

// WriteArchive writes imgs as one docker-archive tarball (`docker save`'s format) at path, built in
// workDir. A layer the images share (the same root file system) is stored once, and layers are made
// reproducibly enough that an unchanged tree gives the same digest from one run to the next.
func WriteArchive(ctx context.Context, path, workDir string, imgs ...Image) error {
	layers := make([][]string, len(imgs))
	for i, img := range imgs {
		if img.Rootfs != "" {
			l := filepath.Join(workDir, "rootfs-"+filepath.Base(img.Rootfs)+".tar")
			if err := rootfsLayer(ctx, img.Rootfs, l); err != nil {
				return err
			}
			layers[i] = append(layers[i], l)
		}
		if len(img.Files) > 0 {
			l := filepath.Join(workDir, "files-"+sanitize(img.Tags[0])+".tar")
			if err := filesLayer(img.Files, l); err != nil {
				return err
			}
			layers[i] = append(layers[i], l)
		}
	}
	return writeDockerArchive(path, imgs, layers)
}

// rootfsLayer tars dir into out with GNU tar (hard links, sparse files and special permissions kept),
// leaving out what a runtime mounts over (/dev, /proc, /sys) and the debootstrap mark. An existing
// layer newer than the tree's mark is reused.
func rootfsLayer(ctx context.Context, dir, out string) error {
	if lst, err := os.Stat(out); err == nil {
		if mst, err := os.Stat(filepath.Join(dir, readyMark)); err == nil && lst.ModTime().After(mst.ModTime()) {
			return nil
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	args := []string{"--create", "--file", out + ".tmp", "--numeric-owner", "--sort=name", "--mtime=@0",
		"--directory", dir, "--anchored", "--exclude=dev/*", "--exclude=proc/*", "--exclude=sys/*"}
	for _, e := range entries {
		if e.Name() != readyMark {
			args = append(args, e.Name())
		}
	}
	if b, err := exec.CommandContext(ctx, "tar", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("tar of %s: %w: %s", dir, err, tail(string(b), 10))
	}
	return os.Rename(out+".tmp", out)
}

// filesLayer writes the files, with their parent directories, as a layer tarball.
func filesLayer(files []File, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	dirs := map[string]bool{}
	var werr error
	for _, file := range files {
		if werr = addFile(tw, dirs, file); werr != nil {
			break
		}
	}
	return errors.Join(werr, tw.Close(), f.Close())
}

func addFile(tw *tar.Writer, dirs map[string]bool, file File) error {
	name := strings.TrimPrefix(filepath.Clean(file.Dst), "/")
	var parents []string
	for d := filepath.Dir(name); d != "." && !dirs[d]; d = filepath.Dir(d) {
		parents = append(parents, d)
	}
	for i := len(parents) - 1; i >= 0; i-- {
		dirs[parents[i]] = true
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: parents[i] + "/", Mode: 0o755}); err != nil {
			return err
		}
	}
	src, err := os.Open(file.Src)
	if err != nil {
		return err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(file.Mode.Perm()), Size: st.Size()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, src)
	return err
}

// writeDockerArchive writes manifest.json, each image's configuration and every layer (once) into path.
func writeDockerArchive(path string, imgs []Image, layers [][]string) error {
	files := map[string]string{} // name in the archive -> layer file, for the layers
	blobs := map[string][]byte{} // name in the archive -> content, for configurations and the manifest
	var manifest []map[string]any
	for i, img := range imgs {
		var diffIDs, layerNames []string
		for _, l := range layers[i] {
			sum, err := fileSHA256(l)
			if err != nil {
				return err
			}
			diffIDs = append(diffIDs, "sha256:"+sum)
			layerNames = append(layerNames, sum+"/layer.tar")
			files[sum+"/layer.tar"] = l
		}
		config, err := json.Marshal(map[string]any{
			"architecture": "amd64",
			"os":           "linux",
			"created":      "1970-01-01T00:00:00Z",
			"config": map[string]any{
				"Entrypoint": img.Entrypoint,
				"Cmd":        img.Cmd,
				"Env":        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
				"WorkingDir": "/",
			},
			"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
		})
		if err != nil {
			return err
		}
		configSum := sha256.Sum256(config)
		configName := hex.EncodeToString(configSum[:]) + ".json"
		blobs[configName] = config
		manifest = append(manifest, map[string]any{"Config": configName, "RepoTags": img.Tags, "Layers": layerNames})
	}
	m, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	blobs["manifest.json"] = m

	f, err := os.Create(path + ".tmp")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	werr := func() error {
		for _, name := range sortedKeys(files) {
			if err := copyInto(tw, name, files[name]); err != nil {
				return err
			}
		}
		for _, name := range sortedKeys(blobs) {
			data := blobs[name]
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}); err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
		return nil
	}()
	if err := errors.Join(werr, tw.Close(), f.Close()); err != nil {
		_ = os.Remove(path + ".tmp")
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return os.Rename(path+".tmp", path)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func copyInto(tw *tar.Writer, name, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: st.Size()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '_'
	}, strings.ToLower(s))
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
