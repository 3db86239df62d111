package floor

import "testing"

// classes returns n successes but for the failures given by index.
func classes(n int, fails map[int]string) []string {
	res := make([]string, n)
	for i, c := range fails {
		res[i] = c
	}
	return res
}

func TestExcused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		res     []string
		excused int
	}{
		{"none failed", classes(30000, nil), 0},
		{"no connection", nil, 0},
		{"one timeout in 5,000", classes(5000, map[int]string{2500: Timeout}), 1},
		{"one timeout in 9,999", classes(9999, map[int]string{5: Timeout}), 1},
		{"one timeout in 1", classes(1, map[int]string{0: Timeout}), 1},
		{"two far apart in 5,000: above the floor", classes(5000, map[int]string{100: Timeout, 4000: Timeout}), 0},
		{"two far apart in 10,000: above the floor", classes(10000, map[int]string{100: Timeout, 9000: Timeout}), 0},
		{"two far apart in 10,001", classes(10001, map[int]string{100: Timeout, 9000: Timeout}), 2},
		{"one timeout in 24,476", classes(24476, map[int]string{9000: Timeout}), 1},
		{"two far apart in 24,476", classes(24476, map[int]string{100: Timeout, 20000: Timeout}), 2},
		{"three far apart in 24,476", classes(24476, map[int]string{100: Timeout, 10000: Timeout, 20000: Timeout}), 3},
		{"four far apart in 24,476: above the floor", classes(24476, map[int]string{100: Timeout, 7000: Timeout, 14000: Timeout, 21000: Timeout}), 0},
		{"two adjacent", classes(30000, map[int]string{100: Timeout, 101: Timeout}), 0},
		{"two 30 apart", classes(30000, map[int]string{100: Timeout, 130: Timeout}), 0},
		{"two 50 apart", classes(30000, map[int]string{100: Timeout, 150: Timeout}), 0},
		{"two 51 apart", classes(30000, map[int]string{100: Timeout, 151: Timeout}), 2},
		{"a refusal", classes(30000, map[int]string{100: "refused"}), 0},
		{"a timeout and a reset", classes(30000, map[int]string{100: Timeout, 20000: "reset"}), 0},
	} {
		if got := Excused(len(tc.res), func(i int) string { return tc.res[i] }); got != tc.excused {
			t.Errorf("%s: Excused = %d, want %d", tc.name, got, tc.excused)
		}
	}
}

func TestAllowed(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 1, 9999: 1, 10000: 1, 10001: 2, 24476: 3, 89000: 9} {
		if got := Allowed(n); got != want {
			t.Errorf("Allowed(%d) = %d, want %d", n, got, want)
		}
	}
}
