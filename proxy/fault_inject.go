//go:build faultinject

package proxy

import (
	"os"
	"time"

	"k8s.io/klog/v2"
)

// In test builds, the sync loop hangs while the file named by KP_FAULT_HANG_SYNC exists, so tests can prove
// that the watchdog restarts a daemon whose sync loop is stuck.
func init() {
	path := os.Getenv("KP_FAULT_HANG_SYNC")
	if path == "" {
		return
	}
	syncFault = func() {
		logged := false
		for {
			if _, err := os.Stat(path); err != nil {
				return
			}
			if !logged {
				klog.InfoS("FAULT INJECTION: sync loop hanging while the file exists", "file", path)
				logged = true
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
