package systemd

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// UseJSONLogs switches klog's output to one JSON object per line on stderr (logging.format: json), through
// the standard library's slog: klog still applies --v and --vmodule, the handler prints what passes.
func UseJSONLogs() {
	h := slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.Level(-128)})
	klog.SetLogger(logr.FromSlogHandler(h))
}

// UseJournalPriorities gives each klog line its syslog priority (<3> errors, <4> warnings, <6> info) when
// stderr is the journal (systemd's JOURNAL_STREAM names it), so `journalctl -p err -u kube-proxy` finds the
// errors. klogFlags is the flag set klog.InitFlags filled. It reports whether it switched.
func UseJournalPriorities(klogFlags *flag.FlagSet) bool {
	if !stderrIsJournal() {
		return false
	}
	for name, value := range map[string]string{"logtostderr": "false", "one_output": "true", "stderrthreshold": "FATAL"} {
		if err := klogFlags.Set(name, value); err != nil {
			return false
		}
	}
	for severity, prefix := range map[string]string{"INFO": "<6>", "WARNING": "<4>", "ERROR": "<3>", "FATAL": "<2>"} {
		klog.SetOutputBySeverity(severity, priorityWriter(prefix))
	}
	return true
}

// priorityWriter writes each klog entry to stderr behind a syslog priority prefix.
type priorityWriter string

func (p priorityWriter) Write(b []byte) (int, error) {
	line := make([]byte, 0, len(p)+len(b))
	line = append(append(line, p...), b...)
	if _, err := os.Stderr.Write(line); err != nil {
		return 0, err
	}
	return len(b), nil
}

// stderrIsJournal reports whether file descriptor 2 is the stream JOURNAL_STREAM ("device:inode") names.
func stderrIsJournal() bool {
	var dev, ino uint64
	if _, err := fmt.Sscanf(os.Getenv("JOURNAL_STREAM"), "%d:%d", &dev, &ino); err != nil {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(2, &st); err != nil {
		return false
	}
	return uint64(st.Dev) == dev && uint64(st.Ino) == ino
}
