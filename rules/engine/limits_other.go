//go:build !linux

package engine

// DefaultDescriptors is a fixed budget where the descriptor limit is not read.
func DefaultDescriptors() int { return 8192 }
