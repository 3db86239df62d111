package config

import (
	"encoding/json"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// ReloadResult is the outcome of one configuration reload: what the daemon logs and counts, records for
// `kube-proxy reload` (and so for `systemctl reload`), and shows in its status line.
type ReloadResult struct {
	// Generation numbers the reloads since the daemon started, from 1.
	Generation uint64
	// Result is ReloadApplied, ReloadInvalid or ReloadRestartRequired.
	Result string
	// Message says what changed, or why the reload was refused.
	Message string
}

// Reload outcomes (ReloadResult.Result).
const (
	ReloadApplied         = "applied"
	ReloadInvalid         = "invalid"
	ReloadRestartRequired = "restart-required"
)

// reloadClass says whether a changed field can be applied to a running
// kube-proxy. Fields are matched by their JSON path or its longest listed
// prefix; ReloadPlan treats anything unlisted as needing a restart.
var reloadClass = map[string]bool{ // true: live
	// Applied by the sync loop or re-rendered by the next full sync.
	"iptables":          true,
	"ipvs":              true,
	"nftables":          true,
	"clusterCIDR":       true,
	"detectLocalMode":   true,
	"detectLocal":       true,
	"nodePortAddresses": true,
	"portRange":         true, // read by nothing
	// Put in force by systemd.Logging.Apply (its liveLoggingFields; a test there keeps the two in step).
	"logging.verbosity":      true,
	"logging.vmodule":        true,
	"logging.flushFrequency": true,

	// Read once at start.
	"apiVersion":                  false,
	"kind":                        false,
	"mode":                        false,
	"hostnameOverride":            false,
	"clientConnection":            false,
	"bindAddress":                 false,
	"healthzBindAddress":          false,
	"metricsBindAddress":          false,
	"bindAddressHardFail":         false,
	"enableProfiling":             false,
	"showHiddenMetricsForVersion": false,
	"featureGates":                false,
	"oomScoreAdj":                 false,
	"configSyncPeriod":            false,
	"logging.format":              false, // the logger and its streams are set up once
	"logging.options":             false,
	"conntrack":                   false, // sysctls are set once at start
	"winkernel":                   false,
	"windowsRunAsService":         false,
	"udpIdleTimeout":              false, // mode userspace's engine takes it at start
}

// ReloadPlan compares the running configuration with a newly loaded one and
// returns the JSON paths of the fields that differ, split into those a
// running kube-proxy can apply (sync periods, logging verbosity, vmodule and
// flushFrequency, and what a full resync re-renders: iptables.*, ipvs.*,
// nftables.*, clusterCIDR, detectLocal*, nodePortAddresses) and those that
// need a restart (mode, hostnameOverride, clientConnection.*, listen
// addresses, featureGates, oomScoreAdj, configSyncPeriod, logging.format,
// logging.options.*, conntrack.*, winkernel.*, ...). Lists and maps are compared as a whole ("nodePortAddresses",
// "featureGates"). Both configurations should be defaulted.
func ReloadPlan(old, new *KubeProxyConfiguration) (live, restart []string) {
	a, b := flatten(old), flatten(new)
	for _, p := range leafPaths() {
		if a[p] == b[p] {
			continue
		}
		if isLive(p) {
			live = append(live, p)
		} else {
			restart = append(restart, p)
		}
	}
	return live, restart
}

func isLive(path string) bool {
	for p := path; p != ""; p = parentPath(p) {
		if l, ok := reloadClass[p]; ok {
			return l
		}
	}
	return false
}

// leafPaths lists the comparable fields of the configuration in struct order.
func leafPaths() []string {
	var out []string
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || isLeafType(t) {
			out = append(out, path)
			return
		}
		for _, f := range jsonFields(t) {
			walk(t.FieldByIndex(f.index).Type, joinPath(path, f.name))
		}
	}
	walk(reflect.TypeFor[KubeProxyConfiguration](), "")
	return out
}

// flatten maps each leaf path of c to its JSON encoding.
func flatten(c *KubeProxyConfiguration) map[string]string {
	out := map[string]string{}
	if c == nil {
		return out
	}
	root := reflect.ValueOf(c).Elem()
	for _, p := range leafPaths() {
		v, ok := valueAt(root, p)
		if !ok {
			out[p] = "null"
			continue
		}
		b, err := json.Marshal(v.Interface())
		if err != nil {
			b = []byte("!" + err.Error())
		}
		out[p] = string(b)
	}
	return out
}

// valueAt follows a dotted JSON path through structs and non-nil pointers.
func valueAt(v reflect.Value, path string) (reflect.Value, bool) {
	for _, name := range strings.Split(path, ".") {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		f, ok := findField(jsonFields(v.Type()), name)
		if !ok {
			return reflect.Value{}, false
		}
		v = v.FieldByIndex(f.index)
	}
	return v, true
}

// DeepCopy returns a copy of c sharing no memory with it.
func (c *KubeProxyConfiguration) DeepCopy() *KubeProxyConfiguration {
	if c == nil {
		return nil
	}
	out := cloneValue(reflect.ValueOf(c).Elem()).Interface().(KubeProxyConfiguration)
	return &out
}

var quantityType = reflect.TypeFor[resource.Quantity]()

// cloneValue returns a deep copy of v.
func cloneValue(v reflect.Value) reflect.Value {
	t := v.Type()
	out := reflect.New(t).Elem()
	switch t.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			p := reflect.New(t.Elem())
			p.Elem().Set(cloneValue(v.Elem()))
			out.Set(p)
		}
	case reflect.Slice:
		if !v.IsNil() {
			s := reflect.MakeSlice(t, v.Len(), v.Len())
			for i := 0; i < v.Len(); i++ {
				s.Index(i).Set(cloneValue(v.Index(i)))
			}
			out.Set(s)
		}
	case reflect.Map:
		if !v.IsNil() {
			m := reflect.MakeMapWithSize(t, v.Len())
			iter := v.MapRange()
			for iter.Next() {
				m.SetMapIndex(iter.Key(), cloneValue(iter.Value()))
			}
			out.Set(m)
		}
	case reflect.Struct:
		if t == quantityType {
			q := v.Interface().(resource.Quantity)
			out.Set(reflect.ValueOf(q.DeepCopy()))
			break
		}
		out.Set(v)
		for i := 0; i < t.NumField(); i++ {
			if t.Field(i).IsExported() {
				out.Field(i).Set(cloneValue(v.Field(i)))
			}
		}
	default:
		out.Set(v)
	}
	return out
}
