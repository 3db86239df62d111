package nfacct

import (
	"errors"
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"kube-proxy/rules/internal/netnstest"
)

// openIn returns a Client of a test namespace's nfacct subsystem.
func openIn(t *testing.T, ns *netnstest.NS) *Client {
	t.Helper()
	c, err := New(int(ns.File(t).Fd()))
	if err != nil {
		t.Fatalf("New in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestKernel creates a counter in a fresh namespace, has an iptables rule count UDP datagrams sent to the
// namespace's loopback with it, and reads the count back; the root namespace's counters are never
// touched.
func TestKernel(t *testing.T) {
	if subsysAcct != unix.NFNL_SUBSYS_ACCT {
		t.Fatalf("subsysAcct = %d, the kernel's NFNL_SUBSYS_ACCT is %d", subsysAcct, unix.NFNL_SUBSYS_ACCT)
	}
	ns := netnstest.New(t)
	c := openIn(t, ns)
	const name = "kp_test_datagrams"
	if _, err := c.Get(name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get before Ensure: %v, want ErrNotFound", err)
	}
	// iptables cannot name a counter that does not exist.
	if _, err := ns.Exec(nil, "iptables-nft", "-A", "OUTPUT", "-p", "udp", "--dport", "9", "-m", "nfacct", "--nfacct-name", name); err == nil {
		t.Fatal("iptables took a rule naming a missing counter")
	}
	for range 2 {
		if err := c.Ensure(name); err != nil {
			t.Fatalf("Ensure: %v", err)
		}
	}
	if _, err := ns.Exec(nil, "iptables-nft", "-A", "OUTPUT", "-p", "udp", "--dport", "9", "-m", "nfacct", "--nfacct-name", name); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.Exec(nil, "ip", "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	err := ns.Do(func() error {
		// Unconnected: the port unreachable errors that come back do not fail the next write.
		conn, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer conn.Close()
		for range 3 {
			if _, err := conn.WriteTo([]byte("counted"), &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != name || got.Packets != 3 || got.Bytes != 3*(20+8+7) {
		t.Errorf("after 3 datagrams: %+v, want 3 packets of 35 bytes", got)
	}
	// Ensure keeps the counts of an existing counter.
	if err := c.Ensure(name); err != nil {
		t.Fatal(err)
	}
	if again, _ := c.Get(name); again.Packets != got.Packets {
		t.Errorf("Ensure reset the counter: %+v, was %+v", again, got)
	}
}
