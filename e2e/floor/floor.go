package floor

// ConnectionsPerTimeout is how many connections one excused timeout takes, rounded up: a run of n
// connections may have ceil(n/ConnectionsPerTimeout) of them.
const ConnectionsPerTimeout = 10000

// IsolationWindow is how far apart, in results, two excused timeouts must be: two closer together
// (their indices differing by IsolationWindow or less) are never excused.
const IsolationWindow = 50

// Timeout is the error class of a connection that timed out.
const Timeout = "timeout"

// Allowed returns how many timeouts a run of n connections may have: ceil(n/ConnectionsPerTimeout).
func Allowed(n int) int {
	return (n + ConnectionsPerTimeout - 1) / ConnectionsPerTimeout
}

// Excused applies the package's rule to n connections whose error classes class(0) … class(n-1) gives
// ("" for a success, Timeout for a timeout, anything else for another failure) and returns how many of
// the failures it excuses: all of them, or 0 when they are not the host's floor (or there are none).
func Excused(n int, class func(i int) string) int {
	var at []int
	for i := 0; i < n; i++ {
		switch class(i) {
		case "":
		case Timeout:
			at = append(at, i)
		default:
			return 0
		}
	}
	if len(at) > Allowed(n) {
		return 0
	}
	for k := 1; k < len(at); k++ {
		if at[k]-at[k-1] <= IsolationWindow {
			return 0
		}
	}
	return len(at)
}
