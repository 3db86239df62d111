//go:build !linux

package userspace

import v1 "k8s.io/api/core/v1"

// FlowCleaner needs Linux's conntrack; elsewhere it does nothing.
type FlowCleaner struct{ Family v1.IPFamily }

// Clean does nothing here.
func (FlowCleaner) Clean([]Destination) error { return nil }
