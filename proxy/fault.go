package proxy

// syncFault, when set, runs at the start of every sync. Only binaries built with the faultinject tag set it
// (fault_inject.go), so production binaries carry no way to make the sync loop misbehave.
var syncFault func()
