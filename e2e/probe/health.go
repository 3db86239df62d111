package probe

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// NoAnswer is the code PollCodes counts, and FormatCodes shows as "no answer", for a probe that got no
// HTTP answer.
const NoAnswer = -1

// StatusCode fetches url with client within timeout and returns the status code, NoAnswer when the
// fetch fails.
func StatusCode(client *http.Client, url string, timeout time.Duration) int {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	code, _, err := Get(ctx, client, url)
	if err != nil {
		return NoAnswer
	}
	return code
}

// PollCodes calls code at once and then every interval until stop is closed, and sends the codes it
// returned, counted, on the channel it returns (buffered: the send never blocks).
func PollCodes(code func() int, interval time.Duration, stop <-chan struct{}) <-chan map[int]int {
	out := make(chan map[int]int, 1)
	go func() {
		codes := map[int]int{}
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			codes[code()]++
			select {
			case <-stop:
				out <- codes
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// FormatCodes shows health codes as "200 ×12, 503 ×3, no answer ×1" (only 200, 503 and NoAnswer; ""
// when there are none of them).
func FormatCodes(codes map[int]int) string {
	var parts []string
	for _, c := range []int{200, 503, NoAnswer} {
		if n := codes[c]; n > 0 {
			name := fmt.Sprint(c)
			if c == NoAnswer {
				name = "no answer"
			}
			parts = append(parts, fmt.Sprintf("%s ×%d", name, n))
		}
	}
	return strings.Join(parts, ", ")
}
