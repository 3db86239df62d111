package main

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100..1, unsorted
	}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"p50 of odd count", ms(3, 1, 2), 0.5, 2 * time.Millisecond},
		{"p50 of even count is the lower middle", ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{"p50 of 100", ms(hundred...), 0.5, 50 * time.Millisecond},
		{"p99 of 100", ms(hundred...), 0.99, 99 * time.Millisecond},
		{"p100", ms(hundred...), 1, 100 * time.Millisecond},
	} {
		if got := percentile(tc.in, tc.p); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want spread
	}{
		{nil, spread{}},
		{[]float64{5}, spread{5, 5, 5, 1}},
		{[]float64{3, 1, 2}, spread{2, 1, 3, 3}},
		{[]float64{4, 1, 3, 2}, spread{2.5, 1, 4, 4}},
	} {
		if got := spreadOf(tc.in); got != tc.want {
			t.Errorf("spreadOf(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}
