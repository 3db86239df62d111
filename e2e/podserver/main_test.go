package main

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestParsePorts(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{in: "", want: nil},
		{in: "80", want: []int{80}},
		{in: "80, 8080,", want: []int{80, 8080}},
		{in: "0", wantErr: true},
		{in: "65536", wantErr: true},
		{in: "http", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parsePorts(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("parsePorts(%q) err = %v, wantErr %v", tt.in, err, tt.wantErr)
			continue
		}
		if len(got) != len(tt.want) {
			t.Errorf("parsePorts(%q) = %v, want %v", tt.in, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("parsePorts(%q) = %v, want %v", tt.in, got, tt.want)
			}
		}
	}
}

func TestServeTCPAndUDPOnLoopback(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go serveTCP("podA", l)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("hit\n")); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	if want := "podA " + c.LocalAddr().String() + "\n"; string(got) != want {
		t.Errorf("TCP answer %q, want %q", got, want)
	}

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go serveUDP("podB", pc)
	u, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	_ = u.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := u.Write([]byte("hit\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	n, err := u.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:n]); !strings.HasPrefix(got, "podB "+u.LocalAddr().String()) {
		t.Errorf("UDP answer %q, want podB %s", got, u.LocalAddr())
	}
}
