package main

import (
	"math"
	"slices"
	"sort"
	"time"
)

// sortedCopy returns a sorted copy of s.
func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	sort.Strings(c)
	return c
}

// percentile returns the nearest-rank p-quantile (0 < p <= 1) of d, 0 for no samples.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	k := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(k, len(s)-1))]
}

// spread is the median, minimum and maximum of a set of per-run values.
type spread struct {
	Median, Min, Max float64
	N                int
}

// spreadOf summarises values; the median of an even count is the mean of the two middle values.
func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	mid := s[len(s)/2]
	if len(s)%2 == 0 {
		mid = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{Median: mid, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// medianInt returns the lower median of v, 0 for none.
func medianInt(v []int) int {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// floorP50 is the median commit (or wall) time of samples.
func floorP50(s []FloorSample, commit bool) time.Duration {
	var d []time.Duration
	for _, x := range s {
		if commit {
			d = append(d, x.Commit)
		} else {
			d = append(d, x.Wall)
		}
	}
	return percentile(d, 0.5)
}
