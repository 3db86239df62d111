// Package packaging holds no code: it is the home of the release scripts (release.sh, tarball.sh, deb.sh,
// readme-excerpt.sh), the Debian maintainer scripts (deb/), the DaemonSet manifests (kubernetes/) and the
// container image recipe (container/), and of the tests that check what they produce.
//
// `make release` runs release.sh, which writes dist/: for linux/amd64 and linux/arm64 the bare static
// binary, a tarball (binary, unit, example config, README excerpt, INSTALL.md) and a .deb, plus the unit,
// the DaemonSet manifest with its image set, and SHA256SUMS. The tests here run without root; the .deb
// and the manifests are also proven on a real systemd and a real API server by e2e/systemdlab.
package packaging
