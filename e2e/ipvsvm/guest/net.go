//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/vishvananda/netns"
)

// sh runs a command, returning its output in the error when it fails.
func sh(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func shOut(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// inNS runs f with its goroutine's thread in the named network namespace ("" is the VM's own). Sockets
// made in f stay in that namespace afterwards.
func inNS(name string, f func() error) error {
	if name == "" {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		h, err := netns.GetFromName(name)
		if err != nil {
			errc <- fmt.Errorf("netns %s: %w", name, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, err) // the thread stays locked and dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// setupNetwork makes the pods (pod1..podN) and the two clients, each in its own namespace behind a veth
// to the VM, which plays the node.
func setupNetwork(pods int) error {
	cmds := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
	}
	peer := func(ns, hostIf, hostV4, hostV6, nsV4, nsV6, gwV4, gwV6 string) {
		cmds = append(cmds,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "addr", "add", hostV4, "dev", hostIf},
			[]string{"ip", "-6", "addr", "add", hostV6, "dev", hostIf, "nodad"},
			[]string{"ip", "link", "set", hostIf, "up"},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", ns, "addr", "add", nsV4, "dev", "eth0"},
			[]string{"ip", "-n", ns, "-6", "addr", "add", nsV6, "dev", "eth0", "nodad"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", ns, "route", "add", "default", "via", gwV4},
			[]string{"ip", "-n", ns, "-6", "route", "add", "default", "via", gwV6},
		)
	}
	for i := 1; i <= pods; i++ {
		peer(podNS(i), fmt.Sprintf("vp%d", i), fmt.Sprintf("10.244.%d.1/24", i), fmt.Sprintf("fd00:10:244:%d::1/64", i),
			fmt.Sprintf("10.244.%d.2/24", i), fmt.Sprintf("fd00:10:244:%d::2/64", i),
			fmt.Sprintf("10.244.%d.1", i), fmt.Sprintf("fd00:10:244:%d::1", i))
	}
	peer("client", "vc1", "10.250.0.1/24", "fd00:250::1/64", "10.250.0.2/24", "fd00:250::2/64", "10.250.0.1", "fd00:250::1")
	peer("client2", "vc2", "10.251.0.1/24", "fd00:251::1/64", "10.251.0.2/24", "fd00:251::2/64", "10.251.0.1", "fd00:251::1")
	for _, c := range cmds {
		if err := sh(c...); err != nil {
			return err
		}
	}
	for i := 1; i <= pods; i++ {
		if err := serve(podNS(i), fmt.Sprintf("pod%d", i)); err != nil {
			return err
		}
	}
	return nil
}

func podNS(i int) string { return fmt.Sprintf("pod%d", i) }

func podIP(i int) string   { return fmt.Sprintf("10.244.%d.2", i) }
func podIPv6(i int) string { return fmt.Sprintf("fd00:10:244:%d::2", i) }

// servedPorts are the TCP and UDP ports every pod answers on.
var servedPorts = []int{80, 8080, 53}

// serve starts the pod's server: on TCP it greets with "<name> <client addr>\n", then answers "ping" lines
// with "pong <name>" until the client closes; on UDP it answers every datagram with the greeting.
func serve(ns, name string) error {
	return inNS(ns, func() error {
		for _, p := range servedPorts {
			l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
			if err != nil {
				return err
			}
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
						sc := bufio.NewScanner(c)
						for sc.Scan() {
							if sc.Text() == "ping" {
								fmt.Fprintf(c, "pong %s\n", name)
							}
						}
					}()
				}
			}()
			u, err := net.ListenPacket("udp", fmt.Sprintf(":%d", p))
			if err != nil {
				return err
			}
			go func() {
				buf := make([]byte, 512)
				for {
					_, from, err := u.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = u.WriteTo([]byte(fmt.Sprintf("%s %s\n", name, from)), from)
				}
			}()
		}
		return nil
	})
}

// hitResult is who answered a series of connections, and from which source address they saw it.
type hitResult struct {
	by      map[string]int // pod name (or "ERR:<reason>") → count
	sources map[string]int // client address as the pods saw it (without port)
}

func (h hitResult) String() string {
	return formatCounts(h.by)
}

func formatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return "{" + b.String() + "}"
}

// errs counts the failed connections.
func (h hitResult) errs() int {
	n := 0
	for k, v := range h.by {
		if strings.HasPrefix(k, "ERR:") {
			n += v
		}
	}
	return n
}

// hit makes n fresh connections (TCP) or datagrams from fresh sockets (UDP) from namespace ns to addr,
// one after another, and counts who answered.
func hit(ns, network, addr string, n int, timeout time.Duration) (hitResult, error) {
	res := hitResult{by: map[string]int{}, sources: map[string]int{}}
	err := inNS(ns, func() error {
		for i := 0; i < n; i++ {
			name, src, err := once(network, addr, timeout)
			if err != nil {
				res.by["ERR:"+errClass(err)]++
				continue
			}
			res.by[name]++
			res.sources[src]++
		}
		return nil
	})
	return res, err
}

func once(network, addr string, timeout time.Duration) (name, src string, err error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	return greet(c, network, timeout)
}

// greet reads a pod's greeting on c (sending a datagram first over UDP), within timeout: the pod's name
// and the client address it saw.
func greet(c net.Conn, network string, timeout time.Duration) (name, src string, err error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if strings.HasPrefix(network, "udp") {
		if _, err := c.Write([]byte("hi\n")); err != nil {
			return "", "", err
		}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", "", err
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		return "", "", fmt.Errorf("bad answer %q", line)
	}
	host, _, _ := net.SplitHostPort(f[1])
	return f[0], host, nil
}

func errClass(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case strings.Contains(err.Error(), "refused"):
		return "refused"
	case strings.Contains(err.Error(), "unreachable"):
		return "unreachable"
	case strings.Contains(err.Error(), "reset"):
		return "reset"
	}
	return "other"
}

// held is a long-lived connection to a pod.
type held struct {
	c   net.Conn
	r   *bufio.Reader
	pod string
}

// hold opens n connections from ns to addr and keeps them open.
func hold(ns, addr string, n int) ([]*held, error) {
	var out []*held
	err := inNS(ns, func() error {
		for i := 0; i < n; i++ {
			c, err := net.DialTimeout("tcp", addr, 3*time.Second)
			if err != nil {
				return err
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			r := bufio.NewReader(c)
			line, err := r.ReadString('\n')
			if err != nil {
				c.Close()
				return err
			}
			_ = c.SetDeadline(time.Time{})
			out = append(out, &held{c: c, r: r, pod: strings.Fields(line)[0]})
		}
		return nil
	})
	if err != nil {
		release(out)
		return nil, err
	}
	return out, nil
}

// ping checks that a held connection still reaches its pod.
func (h *held) ping() error {
	_ = h.c.SetDeadline(time.Now().Add(3 * time.Second))
	defer h.c.SetDeadline(time.Time{})
	if _, err := h.c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := h.r.ReadString('\n')
	if err != nil {
		return err
	}
	if want := "pong " + h.pod + "\n"; line != want {
		return fmt.Errorf("got %q, want %q", line, want)
	}
	return nil
}

func release(hs []*held) {
	for _, h := range hs {
		h.c.Close()
	}
}

func pods(hs []*held) map[string]int {
	m := map[string]int{}
	for _, h := range hs {
		m[h.pod]++
	}
	return m
}
