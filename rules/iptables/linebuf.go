package iptables

import (
	"net/netip"
	"strconv"
)

// lineBuf accumulates iptables-restore lines and counts them. Its methods append one token each, preceded
// by a space unless the line is empty, so a rule reads as a series of calls ending with end().
type lineBuf struct {
	b     []byte
	lines int
}

func (w *lineBuf) reset() { w.b, w.lines = w.b[:0], 0 }

// rule starts an "-A chain" line.
func (w *lineBuf) rule(chain string) *lineBuf {
	w.b = append(w.b, "-A "...)
	w.b = append(w.b, chain...)
	return w
}

// t appends tokens.
func (w *lineBuf) t(tokens ...string) *lineBuf {
	for _, s := range tokens {
		w.b = append(w.b, ' ')
		w.b = append(w.b, s...)
	}
	return w
}

// quoted appends a double-quoted token made of the concatenated parts.
func (w *lineBuf) quoted(parts ...string) *lineBuf {
	w.b = append(w.b, " \""...)
	for _, s := range parts {
		w.b = append(w.b, s...)
	}
	w.b = append(w.b, '"')
	return w
}

// comment appends "-m comment --comment" and the quoted concatenation of parts.
func (w *lineBuf) comment(parts ...string) *lineBuf {
	w.b = append(w.b, " -m comment --comment"...)
	return w.quoted(parts...)
}

func (w *lineBuf) addr(a netip.Addr) *lineBuf {
	w.b = append(w.b, ' ')
	w.b = a.AppendTo(w.b)
	return w
}

func (w *lineBuf) prefix(p netip.Prefix) *lineBuf {
	w.b = append(w.b, ' ')
	w.b = p.AppendTo(w.b)
	return w
}

func (w *lineBuf) num(n int32) *lineBuf {
	w.b = append(w.b, ' ')
	w.b = strconv.AppendInt(w.b, int64(n), 10)
	return w
}

// proto appends "-m proto -p proto", the protocol match as upstream writes it.
func (w *lineBuf) proto(p string) *lineBuf {
	return w.t("-m", p, "-p", p)
}

func (w *lineBuf) end() {
	w.b = append(w.b, '\n')
	w.lines++
}

// chainLine appends the ":chain - [0:0]" declaration of a user chain.
func appendChainLine(b []byte, chain string) []byte {
	b = append(b, ':')
	b = append(b, chain...)
	return append(b, " - [0:0]\n"...)
}
