package probe

import (
	"strings"
	"testing"
)

func TestLogLine(t *testing.T) {
	log := "I1206 05:00:00.000001    4242 server.go:10] \"Starting\"\n" +
		"E1206 05:00:01.000002    4242 reflector.go:20] \"Failed to watch\" err=\"connection refused\"\n" +
		"plain line without a header ] here\n" +
		"I1206 05:00:02.000003    4242 proxier.go:30] " + strings.Repeat("x", 200) + "\n"
	third := strings.Index(log, "plain")
	tests := []struct {
		offset int
		re     string
		want   string
	}{
		{0, "Starting", `"Starting"`},
		{0, "connection refused", `"Failed to watch" err="connection refused"`},
		{third, "Failed to watch", ""},
		{third, "proxier", strings.Repeat("x", 160) + "…"},
		{len(log) + 100, "Starting", `"Starting"`}, // a shorter log than the offset: read from the start
		{0, "without a header", "here"},
		{0, "xxx", strings.Repeat("x", 160) + "…"},
		{0, "absent", ""},
	}
	for _, tc := range tests {
		if got := LogLine(log, tc.offset, tc.re); got != tc.want {
			t.Errorf("LogLine(%d, %q) = %q, want %q", tc.offset, tc.re, got, tc.want)
		}
	}
}

func TestLastStatus(t *testing.T) {
	msgs := []string{"READY=1\nSTATUS=synced", "WATCHDOG=1", "STATUS=last reload refused\nMAINPID=1", "WATCHDOG=1"}
	if got := LastStatus(msgs); got != "last reload refused" {
		t.Errorf("LastStatus = %q", got)
	}
	if got := LastStatus(msgs[1:2]); got != "" {
		t.Errorf("LastStatus without STATUS= = %q", got)
	}
}
