package harness_test

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"kube-proxy/e2e/harness"
)

// envHelper makes the test binary act as a small notify daemon (see runHelper) instead of running tests.
const envHelper = "KP_HARNESS_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(envHelper); mode != "" {
		runHelper(mode)
		return
	}
	harness.Main(m)
}

// runHelper is a stand-in daemon speaking sd_notify: "notify" sends READY=1 (with STATUS and
// MAINPID), a WATCHDOG=1, RELOADING=1 then READY=1 on SIGHUP, STOPPING=1 on SIGTERM and returns;
// "ignore-term" ignores SIGTERM and sleeps, to exercise Process.Stop's kill path.
func runHelper(mode string) {
	switch mode {
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ignoring SIGTERM")
		time.Sleep(time.Minute)
	case "notify":
		send := func(s string) {
			c, err := net.Dial("unixgram", os.Getenv("NOTIFY_SOCKET"))
			if err != nil {
				fmt.Fprintln(os.Stderr, "helper: dial notify socket:", err)
				return
			}
			defer c.Close()
			if _, err := c.Write([]byte(s)); err != nil {
				fmt.Fprintln(os.Stderr, "helper: notify:", err)
			}
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGHUP, syscall.SIGTERM)
		fmt.Println("helper up")
		send(fmt.Sprintf("READY=1\nSTATUS=serving\nMAINPID=%d", os.Getpid()))
		send("WATCHDOG=1")
		for s := range sig {
			if s == syscall.SIGHUP {
				send("RELOADING=1\nMONOTONIC_USEC=1")
				send("READY=1")
				continue
			}
			send("STOPPING=1")
			fmt.Println("helper stopping")
			return
		}
	}
}
