package userspace

import (
	"testing"

	"kube-proxy/e2e/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
