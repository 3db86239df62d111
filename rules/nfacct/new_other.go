//go:build !linux

package nfacct

// New reports that nfacct exists only on Linux.
func New(netns int) (*Client, error) { return nil, ErrNotSupported }
