package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	o, err := parseOptions(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	do := run
	if o.From != "" {
		do = report
	}
	if o.Userspace {
		do = runUserspace
	}
	if err := do(ctx, o); err != nil {
		stop()
		fmt.Fprintln(os.Stderr, "bench failed:", err)
		os.Exit(1)
	}
}
