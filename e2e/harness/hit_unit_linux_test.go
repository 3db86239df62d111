package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestClassify(t *testing.T) {
	sysErr := func(e syscall.Errno) error { return &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", e)} }
	tests := []struct {
		err  error
		want string
	}{
		{context.DeadlineExceeded, "timeout"},
		{fmt.Errorf("read: %w", os.ErrDeadlineExceeded), "timeout"},
		{sysErr(syscall.ECONNREFUSED), "refused"},
		{sysErr(syscall.ECONNRESET), "reset"},
		{sysErr(syscall.EHOSTUNREACH), "host-unreachable"},
		{sysErr(syscall.ENETUNREACH), "net-unreachable"},
		{sysErr(syscall.EACCES), "denied"},
		{io.EOF, "eof"},
		{errors.New("something"), "other"},
	}
	for _, tt := range tests {
		if got := classify(tt.err); got != tt.want {
			t.Errorf("classify(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestCountAndFormatHits(t *testing.T) {
	res := []HitResult{{Pod: "pod2"}, {Pod: "pod1"}, {Err: "timeout"}, {Pod: "pod2"}}
	got := CountHits(res)
	if diff := cmp.Diff(map[string]int{"pod1": 1, "pod2": 2, "ERR:timeout": 1}, got); diff != "" {
		t.Errorf("CountHits (-want +got):\n%s", diff)
	}
	if s := FormatHits(got); s != "ERR:timeout=1 pod1=1 pod2=2" {
		t.Errorf("FormatHits = %q", s)
	}
}

func TestTail(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc"},
		{"a\nb", 5, "a\nb"},
		{"", 3, ""},
		{strings.Repeat("x\n", 100) + "y\nz\n", 2, "y\nz"},
	}
	for _, tt := range tests {
		if got := tail(tt.in, tt.n); got != tt.want {
			t.Errorf("tail(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}
