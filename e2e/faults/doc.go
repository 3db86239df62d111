// Package faults is the fault table: end-to-end tests that break one thing at a time on a node running
// the daemon (a real apiserver, real kernel rules in network namespaces, traffic flowing) and record, per
// mode, what they did, how many connections were sent and failed during the fault, how long the node
// took to converge afterwards, and what an operator sees (health, metrics, log). Each test appends its
// rows to the file named by KP_FAULTS_ROWS (JSON lines); e2e/faults/report renders them into
// docs/RELIABILITY.md. `make test` runs the short form of every row; `make faults` sets KP_FAULTS_LONG=1
// for the full durations and sizes, and rewrites the document.
package faults
