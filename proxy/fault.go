package proxy

import v1 "k8s.io/api/core/v1"

// syncFault, when set, runs at the start of every sync; applyFault, when set, runs before each family's
// Apply and fails it when it returns an error. Only binaries built with the faultinject tag set them
// (fault_inject.go) outside tests, so production binaries carry no way to make the sync loop misbehave.
var (
	syncFault  func()
	applyFault func(family v1.IPFamily) error
)
