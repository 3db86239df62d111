package images

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Dockerfile is what a Dockerfile of the shape of packaging/container/Dockerfile builds: a Debian base
// with packages installed by apt-get, files copied from the build context, and an entrypoint.
type Dockerfile struct {
	// Rootfs is the base image and the packages the RUN instructions install.
	Rootfs Rootfs
	// Files are the COPY instructions, their sources resolved in the build context.
	Files []File
	// Entrypoint is the ENTRYPOINT instruction's exec form.
	Entrypoint []string
}

var (
	debianBase = regexp.MustCompile(`^debian:([a-z]+)(-slim)?$`)
	argRef     = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)
)

// ParseDockerfile reads a Dockerfile and resolves it against the build context directory contextDir,
// with the build arguments args (TARGETARCH, say). It understands the instructions and commands such a
// Dockerfile uses and refuses anything else, naming the line, so the image it describes and the one
// built here cannot drift apart silently: FROM debian:<suite>[-slim], ARG, RUN made of `apt-get update`,
// `apt-get install [-y] [--no-install-recommends] PKG...` and `rm -rf /var/lib/apt/lists/*` joined
// by &&, COPY SRC DST, and ENTRYPOINT in exec form.
func ParseDockerfile(text, contextDir string, args map[string]string) (*Dockerfile, error) {
	d := &Dockerfile{}
	declared := map[string]bool{}
	expand := func(s string, line int) (string, error) {
		var bad error
		out := argRef.ReplaceAllStringFunc(s, func(ref string) string {
			m := argRef.FindStringSubmatch(ref)
			name := m[1] + m[2]
			v, ok := args[name]
			if !declared[name] || !ok {
				bad = fmt.Errorf("line %d: build argument %s is not declared with ARG or has no value", line, name)
			}
			return v
		})
		return out, bad
	}
	for _, in := range logicalLines(text) {
		op, rest, _ := strings.Cut(in.text, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(op) {
		case "FROM":
			m := debianBase.FindStringSubmatch(rest)
			if m == nil {
				return nil, fmt.Errorf("line %d: FROM %s: only debian:<suite>[-slim] bases are understood", in.line, rest)
			}
			d.Rootfs.Suite = m[1]
		case "ARG":
			name, _, _ := strings.Cut(rest, "=")
			declared[name] = true
		case "RUN":
			pkgs, err := runPackages(rest)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", in.line, err)
			}
			d.Rootfs.Packages = append(d.Rootfs.Packages, pkgs...)
		case "COPY":
			f := strings.Fields(rest)
			if len(f) != 2 || strings.HasPrefix(f[0], "--") {
				return nil, fmt.Errorf("line %d: COPY %s: only COPY SRC DST is understood", in.line, rest)
			}
			src, err := expand(f[0], in.line)
			if err != nil {
				return nil, err
			}
			dst, err := expand(f[1], in.line)
			if err != nil {
				return nil, err
			}
			st, err := os.Stat(filepath.Join(contextDir, src))
			if err != nil {
				return nil, fmt.Errorf("line %d: COPY source: %w", in.line, err)
			}
			d.Files = append(d.Files, File{Src: filepath.Join(contextDir, src), Dst: dst, Mode: st.Mode().Perm()})
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &d.Entrypoint); err != nil {
				return nil, fmt.Errorf("line %d: ENTRYPOINT must be in exec form (a JSON array): %w", in.line, err)
			}
		default:
			return nil, fmt.Errorf("line %d: instruction %s is not understood", in.line, op)
		}
	}
	if d.Rootfs.Suite == "" {
		return nil, fmt.Errorf("no FROM instruction")
	}
	return d, nil
}

type logicalLine struct {
	line int // where it starts, from 1
	text string
}

// logicalLines joins continuation lines (ending in a backslash) and drops comments and blank lines.
func logicalLines(text string) []logicalLine {
	var out []logicalLine
	var cur strings.Builder
	start := 0
	for i, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		if cur.Len() == 0 && (t == "" || strings.HasPrefix(t, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(t, "\\") {
			cur.WriteString(strings.TrimSuffix(t, "\\") + " ")
			continue
		}
		cur.WriteString(t)
		out = append(out, logicalLine{line: start, text: strings.Join(strings.Fields(cur.String()), " ")})
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, logicalLine{line: start, text: strings.Join(strings.Fields(cur.String()), " ")})
	}
	return out
}

// runPackages returns the packages a RUN instruction installs, refusing commands other than apt-get's
// update and install and the removal of apt's lists.
func runPackages(run string) ([]string, error) {
	var pkgs []string
	for _, cmd := range strings.Split(run, "&&") {
		f := strings.Fields(cmd)
		switch {
		case len(f) == 2 && f[0] == "apt-get" && f[1] == "update":
		case len(f) == 3 && f[0] == "rm" && f[1] == "-rf" && f[2] == "/var/lib/apt/lists/*":
		case len(f) >= 3 && f[0] == "apt-get" && f[1] == "install":
			for _, a := range f[2:] {
				switch {
				case a == "-y" || a == "--no-install-recommends":
				case strings.HasPrefix(a, "-"):
					return nil, fmt.Errorf("apt-get install option %s is not understood", a)
				default:
					pkgs = append(pkgs, a)
				}
			}
		default:
			return nil, fmt.Errorf("RUN command %q is not understood", strings.TrimSpace(cmd))
		}
	}
	return pkgs, nil
}
