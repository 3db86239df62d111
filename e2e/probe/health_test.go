package probe

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestStatusCode(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			time.Sleep(time.Second)
		}
		if r.URL.Path != "/healthz" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	if got := StatusCode(srv.Client(), srv.URL+"/healthz", time.Second); got != 200 {
		t.Errorf("/healthz: %d, want 200", got)
	}
	if got := StatusCode(srv.Client(), srv.URL+"/other", time.Second); got != 503 {
		t.Errorf("/other: %d, want 503", got)
	}
	if got := StatusCode(srv.Client(), srv.URL+"/slow", 50*time.Millisecond); got != NoAnswer {
		t.Errorf("/slow within 50 ms: %d, want NoAnswer", got)
	}
}

func TestPollCodes(t *testing.T) {
	var calls atomic.Int32
	stop := make(chan struct{})
	out := PollCodes(func() int {
		if calls.Add(1) == 2 {
			return NoAnswer
		}
		return 200
	}, time.Millisecond, stop)
	for calls.Load() < 5 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	codes := <-out
	if codes[NoAnswer] != 1 || codes[200] < 4 || len(codes) != 2 {
		t.Errorf("codes %v after %d calls, want NoAnswer once and 200 the rest", codes, calls.Load())
	}
	if sum := codes[NoAnswer] + codes[200]; sum != int(calls.Load()) {
		t.Errorf("%d codes counted, %d calls made", sum, calls.Load())
	}
}

func TestFormatCodes(t *testing.T) {
	tests := []struct {
		codes map[int]int
		want  string
	}{
		{nil, ""},
		{map[int]int{200: 12}, "200 ×12"},
		{map[int]int{NoAnswer: 1, 503: 3, 200: 12, 404: 5}, "200 ×12, 503 ×3, no answer ×1"},
		{map[int]int{503: 0, NoAnswer: 2}, "no answer ×2"},
	}
	for _, tc := range tests {
		if got := FormatCodes(tc.codes); got != tc.want {
			t.Errorf("FormatCodes(%v) = %q, want %q", tc.codes, got, tc.want)
		}
	}
}
