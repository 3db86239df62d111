package conntrack

import (
	"testing"

	"kube-proxy/config"
)

func TestConntrackMax(t *testing.T) {
	i32 := func(v int32) *int32 { return &v }
	for _, tc := range []struct {
		name       string
		maxPerCore *int32
		min        *int32
		cpus       int
		want       int
	}{
		{"unset leaves it alone", nil, i32(131072), 2, 0},
		{"zero leaves it alone", i32(0), i32(131072), 2, 0},
		{"floor wins on small machines", i32(32768), i32(131072), 2, 131072},
		{"scaled wins on big machines", i32(32768), i32(131072), 8, 262144},
		{"capped at 2^20", i32(32768), i32(0), 64, 1 << 20},
		{"no floor", i32(1000), nil, 4, 4000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := conntrackMax(config.ConntrackConfiguration{MaxPerCore: tc.maxPerCore, Min: tc.min}, tc.cpus)
			if got != tc.want {
				t.Errorf("conntrackMax = %d, want %d", got, tc.want)
			}
		})
	}
}
