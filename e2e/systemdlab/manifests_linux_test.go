package systemdlab

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	memory "k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"kube-proxy/e2e/harness"
)

// readManifests splits a multi-document YAML file into objects, keeping every field as written (no typed
// decoding that would drop unknown ones before the server sees them).
func readManifests(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var objs []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var obj unstructured.Unstructured
		if err := utilyaml.Unmarshal(doc, &obj.Object); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		objs = append(objs, &obj)
	}
}

// TestManifestsServerSideDryRun applies every object of packaging/kubernetes/kube-proxy.yaml to the real
// API server (server-side apply) with dryRun=All and strict field validation: the server runs admission and
// validation and persists nothing. A copy with a misspelt field must be rejected, so the check is known to bite. The API
// server runs with --allow-privileged=true, as kubeadm's does: the DaemonSet's pod is privileged.
func TestManifestsServerSideDryRun(t *testing.T) {
	harness.RequireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := harness.StartClusterWith(ctx, t.TempDir(), harness.ClusterOptions{
		ExtraAPIServerArgs: []string{"--allow-privileged=true"}})
	if err != nil {
		t.Fatalf("starting a cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cluster logs:\n%s", c.LogTail(30))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	cfg, err := c.RESTConfig(harness.UserAdmin)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	// apply is `kubectl apply --server-side --dry-run=server --validate=strict`.
	apply := func(obj *unstructured.Unstructured) error {
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return err
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return err
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if ns := obj.GetNamespace(); ns != "" {
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		force := true
		_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict", FieldManager: "kube-proxy-packaging-test", Force: &force})
		return err
	}

	objs := readManifests(t, filepath.Join(repoRoot(t), "packaging/kubernetes/kube-proxy.yaml"))
	kinds := map[string]bool{}
	for _, obj := range objs {
		kinds[obj.GetKind()] = true
		if err := apply(obj.DeepCopy()); err != nil {
			t.Errorf("%s %s/%s rejected: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
	}
	for _, k := range []string{"ServiceAccount", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if !kinds[k] {
			t.Errorf("the manifest has no %s", k)
		}
	}
	// Dry run: nothing was stored.
	if _, err := c.Admin.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{}); err == nil {
		t.Error("the dry run stored the DaemonSet")
	}

	for _, obj := range objs {
		if obj.GetKind() != "DaemonSet" {
			continue
		}
		bad := obj.DeepCopy()
		spec, _, _ := unstructured.NestedMap(bad.Object, "spec", "template", "spec")
		spec["hostNetwrk"] = true
		if err := unstructured.SetNestedMap(bad.Object, spec, "spec", "template", "spec"); err != nil {
			t.Fatal(err)
		}
		err := apply(bad)
		if err == nil || !strings.Contains(err.Error(), "hostNetwrk") {
			t.Errorf("a DaemonSet with a misspelt field was not rejected by name: %v", err)
		}
	}
}
