// Package conntrack removes UDP and SCTP conntrack entries that would keep steering a Service's packets to
// where it no longer goes: to an endpoint that stopped serving, or nowhere (entries created while the
// Service had no endpoints). TCP needs no help: its connections end, or are reset, on their own.
package conntrack
