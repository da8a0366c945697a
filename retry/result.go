package retry

import (
	"encoding/json"
	"time"

	"github.com/orchard/orchard/faults"
)

// Attempt is the record of one attempt. In JSON its durations are
// milliseconds, as elsewhere in the API:
//
//	{"attempt":1,"error":{...},"duration_ms":12.5,"wait_ms":80}
type Attempt struct {
	// N counts from 1.
	N int
	// Err is the class of the attempt's failure; nil when it succeeded.
	Err *faults.Info
	// Duration is how long the attempt ran.
	Duration time.Duration
	// Wait is the backoff that followed the attempt; 0 after the last.
	Wait time.Duration
}

type attemptJSON struct {
	N          int          `json:"attempt"`
	Err        *faults.Info `json:"error,omitempty"`
	DurationMS float64      `json:"duration_ms"`
	WaitMS     float64      `json:"wait_ms,omitempty"`
}

// MarshalJSON writes durations as milliseconds.
func (a Attempt) MarshalJSON() ([]byte, error) {
	return json.Marshal(attemptJSON{N: a.N, Err: a.Err, DurationMS: ms(a.Duration), WaitMS: ms(a.Wait)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (a *Attempt) UnmarshalJSON(b []byte) error {
	var w attemptJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*a = Attempt{N: w.N, Err: w.Err, Duration: fromMS(w.DurationMS), Wait: fromMS(w.WaitMS)}
	return nil
}

// Result reports a run of Do: every attempt in order, why it stopped and
// how long it took. In JSON:
//
//	{"attempts":[...],"outcome":"succeeded","elapsed_ms":212.3}
type Result struct {
	Attempts []Attempt
	Outcome  Outcome
	// Elapsed is the wall-clock time of the whole run, waits included.
	Elapsed time.Duration

	last error // the last attempt's error, nil if it succeeded
}

type resultJSON struct {
	Attempts  []Attempt `json:"attempts"`
	Outcome   Outcome   `json:"outcome"`
	ElapsedMS float64   `json:"elapsed_ms"`
}

// Count is the number of attempts made.
func (r Result) Count() int { return len(r.Attempts) }

// LastErr is the error of the last attempt as the operation returned it
// (with the timeout class added when PerAttempt or Budget cut it short),
// or nil when it succeeded or none ran. JSON carries only its class, in
// Attempts.
func (r Result) LastErr() error { return r.last }

// MarshalJSON writes durations as milliseconds.
func (r Result) MarshalJSON() ([]byte, error) {
	a := r.Attempts
	if a == nil {
		a = []Attempt{}
	}
	return json.Marshal(resultJSON{Attempts: a, Outcome: r.Outcome, ElapsedMS: ms(r.Elapsed)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Result) UnmarshalJSON(b []byte) error {
	var w resultJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = Result{Attempts: w.Attempts, Outcome: w.Outcome, Elapsed: fromMS(w.ElapsedMS)}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func fromMS(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
