//go:build faultinject

package proxy

import (
	"fmt"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// In test builds, the sync loop hangs while the file named by KP_FAULT_HANG_SYNC exists, so tests can prove
// that the watchdog restarts a daemon whose sync loop is stuck; and every family's apply fails while the
// file named by KP_FAULT_FAIL_APPLY exists, so tests can prove that failing syncs neither stop the watchdog
// nor make a node without pending changes unhealthy.
func init() {
	if path := os.Getenv("KP_FAULT_HANG_SYNC"); path != "" {
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
	if path := os.Getenv("KP_FAULT_FAIL_APPLY"); path != "" {
		applyFault = func(family v1.IPFamily) error {
			if _, err := os.Stat(path); err != nil {
				return nil
			}
			return fmt.Errorf("FAULT INJECTION: %s apply fails while %s exists", family, path)
		}
	}
}
