package faults

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// EnvRows names the file the tests append their rows to; EnvLong selects the full durations and sizes.
const (
	EnvRows = "KP_FAULTS_ROWS"
	EnvLong = "KP_FAULTS_LONG"
)

// Row is one measured line of the fault table.
type Row struct {
	// Order sorts the rows of the document (the fault's place in the table).
	Order int `json:"order"`
	// Mode is the daemon's mode (iptables, nftables).
	Mode string `json:"mode"`
	// Fault is what breaks; Action what the test does to break it and to check the node.
	Fault  string `json:"fault"`
	Action string `json:"action"`
	// Sent and Failed count the connections made to existing Services while the fault lasted.
	Sent   int `json:"sent"`
	Failed int `json:"failed"`
	// Converge is how long the node took to be right again once the fault ended (or, for a fault the
	// node repairs, after it began); empty when it does not apply.
	Converge string `json:"converge,omitempty"`
	// Sees is what an operator sees: health, STATUS line, metrics, log.
	Sees string `json:"sees"`
	// Long is set for rows measured with the full durations (KP_FAULTS_LONG).
	Long bool `json:"long"`
	// When is the time of the measurement.
	When time.Time `json:"when"`
}

var rowsMu sync.Mutex

// Record appends r to the KP_FAULTS_ROWS file, if set.
func Record(r Row) error {
	path := os.Getenv(EnvRows)
	if path == "" {
		return nil
	}
	r.Long = Long()
	r.When = time.Now().UTC()
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	rowsMu.Lock()
	defer rowsMu.Unlock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("recording a fault row: %w", err)
	}
	defer f.Close()
	_, err = f.Write(append(b, '\n'))
	return err
}

// Long reports whether the full durations and sizes are asked for.
func Long() bool { return os.Getenv(EnvLong) != "" }

// Pick returns long under KP_FAULTS_LONG, else short.
func Pick[T any](short, long T) T {
	if Long() {
		return long
	}
	return short
}

// Seconds formats a duration for the table.
func Seconds(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	default:
		return fmt.Sprintf("%.1f min", d.Minutes())
	}
}
