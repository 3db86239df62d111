// Package metricstest reads what a Prometheus registry exports, for the dataplanes' metric tests.
package metricstest

import (
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Values gathers g and returns every sample whose metric name starts with prefix, keyed by the name and,
// when the sample has labels, `{name="value",...}` in label order: a counter's or gauge's value, or a
// histogram's number of observations. It fails t when gathering fails.
func Values(t testing.TB, g prometheus.Gatherer, prefix string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), prefix) {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			if len(m.GetLabel()) > 0 {
				var ls []string
				for _, l := range m.GetLabel() {
					ls = append(ls, l.GetName()+`="`+l.GetValue()+`"`)
				}
				sort.Strings(ls)
				key += "{" + strings.Join(ls, ",") + "}"
			}
			out[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return out
}
