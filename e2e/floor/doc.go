// Package floor is the end-to-end tests' one rule for the noise floor: which failed connections of a
// check that wants none may be forgiven as the loaded host's, not the code's.
//
// With nothing happening, 4–5 of 82,000–89,000 connections time out on these two-core hosts
// (docs/RELIABILITY.md, the baseline rows), so a check that wants none of tens of thousands of
// connections would fail now and then for nothing. A check's failures are that floor, and all of them are
// excused, when
//
//   - every one is a timeout: a refusal, a reset, an unreachable host or a wrong answer never is;
//   - there are at most ceil(n/ConnectionsPerTimeout) of them for n connections: one in a run of up to
//     10,000 (however short), two in 10,001 to 20,000, and so on;
//   - no two of them lie within IsolationWindow results of each other: what a broken dataplane does
//     looks different, a gap in the rules fails every connection made in it, many in a row.
//
// Otherwise none is excused. The package knows connections only by their error classes, "" for a
// success and "timeout" for a timeout, so harness.ExpectNoFailures, e2e/faults and the IPVS VM's guest
// (which first drops the timeouts during which its CPUs did not run) share it.
package floor
