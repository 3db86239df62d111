package xtables

import (
	"net/netip"
	"strconv"
)

// Lines accumulates iptables-restore lines and counts them: the payload builder of the modes that write
// iptables rules. Its methods append one token each, preceded by a space unless the line is empty, so a
// rule reads as a series of calls ending with End. They do not allocate but to grow B.
type Lines struct {
	B     []byte // the lines
	Lines int    // how many lines B holds since the last Reset (or since the owner set it)
}

// Reset empties the buffer, keeping its memory.
func (w *Lines) Reset() { w.B, w.Lines = w.B[:0], 0 }

// Add appends the whole rule "-A chain args...".
func (w *Lines) Add(chain string, args ...string) { w.Rule(chain).T(args...).End() }

// Rule starts an "-A chain" line.
func (w *Lines) Rule(chain string) *Lines {
	w.B = append(w.B, "-A "...)
	w.B = append(w.B, chain...)
	return w
}

// T appends tokens.
func (w *Lines) T(tokens ...string) *Lines {
	for _, s := range tokens {
		w.B = append(w.B, ' ')
		w.B = append(w.B, s...)
	}
	return w
}

// Quoted appends a double-Quoted token made of the concatenated parts.
func (w *Lines) Quoted(parts ...string) *Lines {
	w.B = append(w.B, " \""...)
	for _, s := range parts {
		w.B = append(w.B, s...)
	}
	w.B = append(w.B, '"')
	return w
}

// Comment appends "-m Comment --Comment" and the quoted concatenation of parts.
func (w *Lines) Comment(parts ...string) *Lines {
	w.B = append(w.B, " -m comment --comment"...)
	return w.Quoted(parts...)
}

func (w *Lines) Addr(a netip.Addr) *Lines {
	w.B = append(w.B, ' ')
	w.B = a.AppendTo(w.B)
	return w
}

func (w *Lines) Prefix(p netip.Prefix) *Lines {
	w.B = append(w.B, ' ')
	w.B = p.AppendTo(w.B)
	return w
}

func (w *Lines) Num(n int32) *Lines {
	w.B = append(w.B, ' ')
	w.B = strconv.AppendInt(w.B, int64(n), 10)
	return w
}

// Proto appends "-m Proto -p Proto", the protocol match as upstream writes it.
func (w *Lines) Proto(p string) *Lines {
	return w.T("-m", p, "-p", p)
}

func (w *Lines) End() {
	w.B = append(w.B, '\n')
	w.Lines++
}

// AppendChainLine appends the ":chain - [0:0]" declaration of a user chain.
func AppendChainLine(b []byte, chain string) []byte {
	b = append(b, ':')
	b = append(b, chain...)
	return append(b, " - [0:0]\n"...)
}
