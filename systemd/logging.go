package systemd

import (
	"log/slog"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// UseJSONLogs switches klog's output to one JSON object per line on stderr (logging.format: json), through
// the standard library's slog: klog still applies --v and --vmodule, the handler prints what passes.
func UseJSONLogs() {
	h := slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.Level(-128)})
	klog.SetLogger(logr.FromSlogHandler(h))
}
