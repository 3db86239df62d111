package probe

import (
	"regexp"
	"strings"
)

// LogLine returns the first line of a daemon's log, from offset bytes on (from the start when the log
// is shorter: it was replaced), that matches re, trimmed, without klog's header (level, date, time,
// pid, file:line) and cut to 160 bytes with "…"; "" when none matches.
func LogLine(log string, offset int, re string) string {
	if offset > len(log) {
		offset = 0
	}
	m := strings.TrimSpace(regexp.MustCompile(`(?m)^.*(` + re + `).*$`).FindString(log[offset:]))
	if i := strings.Index(m, "] "); i >= 0 && i < 60 {
		m = m[i+2:]
	}
	if len(m) > 160 {
		m = m[:160] + "…"
	}
	return m
}

// LastStatus returns the value of the last STATUS= line in messages, sd_notify datagrams in the order
// received; "" when there is none.
func LastStatus(messages []string) string {
	st := ""
	for _, m := range messages {
		for _, l := range strings.Split(m, "\n") {
			if s, ok := strings.CutPrefix(l, "STATUS="); ok {
				st = s
			}
		}
	}
	return st
}
