package nfacct

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestCollector(t *testing.T) {
	desc := prometheus.NewDesc("test_packets_total", "Packets counted.", nil, nil)
	tests := []struct {
		name     string
		existing *Counter
		want     []float64 // the samples gathered
	}{
		{name: "counter exists", existing: &Counter{Name: "pkts", Packets: 42, Bytes: 4200}, want: []float64{42}},
		{name: "counter not created yet", want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newFakeKernel(t)
			if tt.existing != nil {
				k.counters[tt.existing.Name] = tt.existing
			}
			c := k.client()
			defer c.Close()
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(NewCollector(c, "pkts", desc))
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			var got []float64
			for _, mf := range mfs {
				if mf.GetType() != dto.MetricType_COUNTER {
					t.Errorf("%s is a %v, want a counter", mf.GetName(), mf.GetType())
				}
				for _, m := range mf.GetMetric() {
					got = append(got, m.GetCounter().GetValue())
				}
			}
			if len(got) != len(tt.want) || (len(got) == 1 && got[0] != tt.want[0]) {
				t.Errorf("gathered %v, want %v", got, tt.want)
			}
			// The kernel counts on: the next scrape reads the new value.
			if tt.existing != nil {
				k.counters["pkts"].Packets++
				mfs, _ = reg.Gather()
				if v := mfs[0].GetMetric()[0].GetCounter().GetValue(); v != tt.want[0]+1 {
					t.Errorf("after one more packet: %v, want %v", v, tt.want[0]+1)
				}
			}
		})
	}
}
