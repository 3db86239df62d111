//go:build !linux

package engine

// defaultMaxConns is a fixed cap where the descriptor limit is not read.
func defaultMaxConns() int { return 4096 }
