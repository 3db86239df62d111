// Package config loads, defaults, validates and writes kube-proxy's
// configuration file, the KubeProxyConfiguration of API group
// kubeproxy.config.k8s.io, version v1alpha1, exactly as upstream kube-proxy
// v1.37 reads it, and maps upstream's command-line flags onto it.
//
// The package has no side effects: it reads the file it is given and the flag
// set it is handed, and returns values. Loading is strict: an unknown or
// duplicated field, a value of the wrong type, or a value upstream would reject
// is an error naming the file, the JSON field path (for example
// "iptables.minSyncPeriod" or "nodePortAddresses[1]") and, where it is known,
// the line. All problems are reported together (errors.Join of *FieldError).
//
// Defaults are upstream's v1alpha1 defaults plus upstream's Linux platform
// defaults (mode iptables, detectLocalMode ClusterCIDR), with one addition:
// an empty ipvs.scheduler becomes "rr", which is what upstream's IPVS proxier
// uses when the field is empty.
package config
