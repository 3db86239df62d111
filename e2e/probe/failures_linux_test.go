package probe

import (
	"errors"
	"testing"
	"time"
)

func TestFailuresAndFloor(t *testing.T) {
	run := func(n int, errs map[int]string) []HitResult {
		res := make([]HitResult, n)
		for i, e := range errs {
			res[i].Err = e
		}
		return res
	}
	tests := []struct {
		name   string
		res    []HitResult
		failed int
		within bool
	}{
		{"none failed", run(100, nil), 0, true},
		{"one timeout", run(100, map[int]string{40: "timeout"}), 1, true},
		{"one refusal", run(100, map[int]string{40: "refused"}), 1, false},
		{"two timeouts in 10,000", run(10000, map[int]string{10: "timeout", 9000: "timeout"}), 2, false},
		{"two isolated timeouts in 10,001", run(10001, map[int]string{10: "timeout", 9000: "timeout"}), 2, true},
		{"two close timeouts in 10,001", run(10001, map[int]string{10: "timeout", 60: "timeout"}), 2, false},
	}
	for _, tc := range tests {
		if got := Failures(tc.res); got != tc.failed {
			t.Errorf("%s: Failures = %d, want %d", tc.name, got, tc.failed)
		}
		if got := WithinFloor(tc.res); got != tc.within {
			t.Errorf("%s: WithinFloor = %v, want %v", tc.name, got, tc.within)
		}
	}
}

func TestReachable(t *testing.T) {
	calls := 0
	took, err := Reachable(time.Minute, func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 3 || took < 40*time.Millisecond {
		t.Errorf("Reachable on the third try: %v after %d calls, %v", took, calls, err)
	}
	calls = 0
	took, err = Reachable(50*time.Millisecond, func() error { calls++; return errors.New("never") })
	if err == nil || err.Error() != "never" || took <= 50*time.Millisecond || calls < 2 {
		t.Errorf("Reachable never: %v after %d calls, %v", took, calls, err)
	}
}
