// Command podserver is the e2e harness's stand-in for a pod's workload. On every TCP connection it
// writes "<name> <client-ip:port>\n" and closes; to every UDP datagram it replies with the same line.
// The client address is the one the server sees, so a test can tell whether traffic was SNATed.
//
//	podserver -name pod1 -tcp 80,8080 -udp 53 -ready /tmp/x/ready
//
// It listens on all addresses (IPv4 and IPv6) of its network namespace, writes the -ready file once
// every socket is bound, and exits 0 on SIGTERM or SIGINT.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	host, _ := os.Hostname()
	name := flag.String("name", host, "name to answer with")
	tcp := flag.String("tcp", "", "comma-separated TCP ports")
	udp := flag.String("udp", "", "comma-separated UDP ports")
	ready := flag.String("ready", "", "file to create once all sockets are bound")
	flag.Parse()
	log.SetFlags(log.Lmicroseconds)
	log.SetPrefix("podserver " + *name + ": ")
	if err := run(*name, *tcp, *udp, *ready); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

func run(name, tcpPorts, udpPorts, ready string) error {
	tcp, err := parsePorts(tcpPorts)
	if err != nil {
		return fmt.Errorf("-tcp: %w", err)
	}
	udp, err := parsePorts(udpPorts)
	if err != nil {
		return fmt.Errorf("-udp: %w", err)
	}
	if len(tcp)+len(udp) == 0 {
		return errors.New("no ports: give -tcp and/or -udp")
	}
	for _, p := range tcp {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			return err
		}
		go serveTCP(name, l)
	}
	for _, p := range udp {
		c, err := net.ListenPacket("udp", ":"+strconv.Itoa(p))
		if err != nil {
			return err
		}
		go serveUDP(name, c)
	}
	if ready != "" {
		if err := os.WriteFile(ready, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			return fmt.Errorf("writing ready file: %w", err)
		}
	}
	log.Printf("serving tcp %v udp %v", tcp, udp)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	log.Printf("exiting on %v", <-sig)
	return nil
}

func parsePorts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := strconv.Atoi(f)
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("bad port %q", f)
		}
		out = append(out, p)
	}
	return out, nil
}

func answer(name string, from net.Addr) []byte {
	return []byte(name + " " + from.String() + "\n")
}

func serveTCP(name string, l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			log.Printf("accept: %v", err)
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(answer(name, c.RemoteAddr())); err != nil {
				return
			}
			// Half-close, then read until the client closes: closing with unread data would
			// turn our FIN into a RST that can destroy the answer in flight.
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			_, _ = io.Copy(io.Discard, c)
		}()
	}
}

func serveUDP(name string, c net.PacketConn) {
	buf := make([]byte, 2048)
	for {
		_, from, err := c.ReadFrom(buf)
		if err != nil {
			log.Printf("udp read: %v", err)
			return
		}
		if _, err := c.WriteTo(answer(name, from), from); err != nil {
			log.Printf("udp reply to %v: %v", from, err)
		}
	}
}
