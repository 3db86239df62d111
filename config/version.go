package config

import (
	"fmt"
	"strconv"
	"strings"

	utilversion "k8s.io/apimachinery/pkg/util/version"
)

// VersionFlag is --version with upstream's meanings (component-base's verflag): --version or
// --version=true prints the version and exits, --version=raw prints it as a Go value and exits,
// --version=false does nothing, and --version=vX.Y.Z... sets the Kubernetes version the daemon reports
// (it must be a semantic version with the major, minor and patch of UpstreamRelease) and lets it run.
type VersionFlag struct {
	// value is "", "true", "false", "raw" or a version starting with v.
	value string
}

// Set implements pflag.Value.
func (v *VersionFlag) Set(s string) error {
	if s == "raw" {
		v.value = s
		return nil
	}
	if strings.HasPrefix(s, "v") {
		if err := sameRelease(s, UpstreamRelease); err != nil {
			return err
		}
		v.value = s
		return nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true, false, raw or a version vX.Y.Z, not %q", s)
	}
	v.value = strconv.FormatBool(b)
	return nil
}

// String implements pflag.Value.
func (v *VersionFlag) String() string {
	if v.value == "" {
		return "false"
	}
	return v.value
}

// Type implements pflag.Value.
func (v *VersionFlag) Type() string { return "version" }

// Print reports whether the version is to be printed before exiting, and whether raw (as a Go value).
func (v *VersionFlag) Print() (print, raw bool) {
	return v.value == "true" || v.value == "raw", v.value == "raw"
}

// Release is the Kubernetes version the daemon reports: --version=vX.Y.Z's, else UpstreamRelease.
func (v *VersionFlag) Release() string {
	if strings.HasPrefix(v.value, "v") {
		return v.value
	}
	return UpstreamRelease
}

// sameRelease checks that version is a semantic version with the major, minor and patch of release, as
// upstream's --version=vX.Y.Z requires.
func sameRelease(version, release string) error {
	if version == release {
		return nil
	}
	got, err := utilversion.ParseSemantic(version)
	if err != nil {
		return err
	}
	want := utilversion.MustParseSemantic(release)
	if got.Major() != want.Major() || got.Minor() != want.Minor() || got.Patch() != want.Patch() {
		return fmt.Errorf("%s is not a build of Kubernetes %s: the major, minor and patch numbers must be the same", version, release)
	}
	return nil
}
