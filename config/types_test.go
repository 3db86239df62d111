package config

import (
	"reflect"
	"strings"
	"testing"
)

// TestMasqueradeAndNodePortAddressesOfTheMode: the mode picks the section masquerading is read from, an
// unset bit is the default, an out-of-range one an error naming its field; mode nftables alone turns an
// empty nodePortAddresses into "primary".
func TestMasqueradeAndNodePortAddressesOfTheMode(t *testing.T) {
	c := &KubeProxyConfiguration{}
	c.IPTables.MasqueradeAll = true
	c.NFTables.MasqueradeBit = ptr[int32](20)
	if all, bit, err := c.Masquerade(); err != nil || !all || bit != DefaultMasqueradeBit {
		t.Errorf("mode \"\": Masquerade() = %v, %d, %v; want iptables' true, %d", all, bit, err, DefaultMasqueradeBit)
	}
	if got := c.EffectiveNodePortAddresses(); len(got) != 0 {
		t.Errorf("mode \"\": EffectiveNodePortAddresses() = %v, want none (every address)", got)
	}
	c.Mode = ModeNFTables
	if all, bit, err := c.Masquerade(); err != nil || all || bit != 20 {
		t.Errorf("mode nftables: Masquerade() = %v, %d, %v; want nftables' false, 20", all, bit, err)
	}
	if got := c.EffectiveNodePortAddresses(); !reflect.DeepEqual(got, []string{NodePortAddressesPrimary}) {
		t.Errorf("mode nftables: EffectiveNodePortAddresses() = %v, want [primary]", got)
	}
	c.NodePortAddresses = []string{"192.0.2.0/24"}
	if got := c.EffectiveNodePortAddresses(); !reflect.DeepEqual(got, c.NodePortAddresses) {
		t.Errorf("mode nftables, set: EffectiveNodePortAddresses() = %v, want %v", got, c.NodePortAddresses)
	}
	c.NFTables.MasqueradeBit = ptr[int32](32)
	if _, _, err := c.Masquerade(); err == nil || !strings.Contains(err.Error(), "nftables.masqueradeBit") {
		t.Errorf("bit 32: Masquerade() error %v, want one naming nftables.masqueradeBit", err)
	}
}
