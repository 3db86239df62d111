package probe

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Get fetches url with client within ctx and returns the status code and the body.
func Get(ctx context.Context, client *http.Client, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// samples calls f with the value text of every sample of name in a Prometheus text body whose line
// contains every one of labels, until f returns false.
func samples(body, name string, labels []string, f func(value string) bool) {
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
				break
			}
		}
		if ok && !f(line) {
			return
		}
	}
}

// MetricValue returns the value of the first sample of name in a Prometheus text body whose labels
// contain every one of labels (each written `key="value"`; any substring of the line matches).
func MetricValue(body, name string, labels ...string) (float64, bool) {
	var v float64
	var found bool
	samples(body, name, labels, func(line string) bool {
		f := strings.Fields(line)
		var err error
		v, err = strconv.ParseFloat(f[len(f)-1], 64)
		found = err == nil
		return false
	})
	return v, found
}

// SumMetric adds up every sample of name in a Prometheus text body whose line contains every one of
// labels (0 when there is none); a sample whose value does not parse is skipped.
func SumMetric(body, name string, labels ...string) float64 {
	var sum float64
	samples(body, name, labels, func(line string) bool {
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			sum += v
		}
		return true
	})
	return sum
}
