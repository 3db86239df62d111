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
// The exceptions, as upstream loads them too, are the fields older v1alpha1
// releases had (udpIdleTimeout, resourceContainer, conntrack.max, ...): they
// are ignored with a warning in the same form. Feature gates are checked
// against upstream v1.37.2's gates (features_list.go) the way upstream checks
// them: unknown names, locked gates set to their other value and disabled
// dependencies are errors.
//
// Defaults are upstream's v1alpha1 defaults plus upstream's Linux platform
// defaults (mode iptables, detectLocalMode ClusterCIDR), with one addition:
// an empty ipvs.scheduler becomes "rr", which is what upstream's IPVS proxier
// uses when the field is empty.
package config
