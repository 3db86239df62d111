package config

import (
	"strings"
	"testing"
)

func TestParseIP(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" for invalid
	}{
		{"10.0.0.1", "10.0.0.1"},
		{"010.000.001.002", "10.0.1.2"}, // leading zeros read as decimal, as Kubernetes does
		{"fd00::1", "fd00::1"},
		{"::", "::"},
		{"256.0.0.1", ""},
		{"1.2.3", ""},
		{"1.2.3.4.5", ""},
		{"0x1.2.3.4", ""},
		{"1234.0.0.1", ""},
		{"", ""},
		{"localhost", ""},
	}
	for _, tt := range tests {
		ip := parseIP(tt.in)
		got := ""
		if ip != nil {
			got = ip.String()
		}
		if got != tt.want {
			t.Errorf("parseIP(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseCIDR(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr string
	}{
		{"10.0.0.0/8", "10.0.0.0/8", ""},
		{"10.1.2.3/16", "10.1.0.0/16", ""},
		{"010.001.0.0/16", "10.1.0.0/16", ""},
		{"fd00::/64", "fd00::/64", ""},
		{"10.0.0.1", "", "want address/prefix-length"},
		{"10.0.0.0/33", "", "bad prefix length"},
		{"10.0.0/8", "", "bad address"},
		{"fd00::/129", "", "bad prefix length"},
		{"10.0.0.0/-1", "", "bad prefix length"},
	}
	for _, tt := range tests {
		n, err := parseCIDR(tt.in)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseCIDR(%q) error = %v, want ~%q", tt.in, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("parseCIDR(%q): %v", tt.in, err)
		case n.String() != tt.want:
			t.Errorf("parseCIDR(%q) = %s, want %s", tt.in, n, tt.want)
		}
	}
}

func TestValidateHostPort(t *testing.T) {
	tests := []struct {
		in      string
		wantErr string
	}{
		{"0.0.0.0:10256", ""},
		{"[::1]:10249", ""},
		{"127.0.0.1:65535", ""},
		{"127.0.0.1", "must be ip:port"},
		{"::1:10249", "must be ip:port"},
		{"127.0.0.1:0", "1..65535"},
		{"127.0.0.1:65536", "1..65535"},
		{"127.0.0.1:http", "1..65535"},
		{"example.com:80", "not an IP address"},
	}
	for _, tt := range tests {
		got := validateHostPort(tt.in)
		if (tt.wantErr == "") != (got == "") || !strings.Contains(got, tt.wantErr) {
			t.Errorf("validateHostPort(%q) = %q, want ~%q", tt.in, got, tt.wantErr)
		}
	}
}
