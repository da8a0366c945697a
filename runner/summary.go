package runner

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/orchard/orchard/api"
)

// Outcomes of an episode in a run: the server's three, and two of the
// runner's own.
const (
	OutcomeSuccess  = "success"
	OutcomeFailure  = "failure"
	OutcomeEnvError = "env_error"
	// OutcomeError: the episode could not be run to an outcome because of
	// the policy or the caller (a policy endpoint down, a task without a
	// script, a malformed action body). Never re-queued.
	OutcomeError = "error"
	// OutcomeCanceled: the run was canceled before the episode ended; the
	// episode was aborted.
	OutcomeCanceled = "canceled"
)

// Attribution names the fault that ended an episode (env_error or error)
// and the step it happened at (0: before the first action).
type Attribution = api.Attribution

// EpisodeResult is one episode of a task.
type EpisodeResult struct {
	TaskID  string `json:"task_id"`
	Attempt int    `json:"attempt"`
	// EpisodeID is empty when no episode was created (the server refused
	// it, or the policy could not be made).
	EpisodeID   string       `json:"episode_id,omitempty"`
	Outcome     string       `json:"outcome"`
	Reward      *float64     `json:"reward,omitempty"`
	Steps       int          `json:"steps"`
	Answer      string       `json:"answer,omitempty"`
	RecordingID string       `json:"recording_id,omitempty"`
	Attribution *Attribution `json:"attribution,omitempty"`
	DurationMS  float64      `json:"duration_ms"`
	// StartedAt is when the runner started the episode: with DurationMS it
	// places the episode's end on the run's timeline (episodes per minute).
	StartedAt time.Time `json:"started_at"`
	// StepMS are the round trips of the episode's steps as the runner saw
	// them (the action, the wait for the page, the observation).
	StepMS []float64 `json:"-"`
}

// TaskResult is a task's result: its last episode's, with every episode
// it took (more than one when env_error episodes were re-queued).
type TaskResult struct {
	TaskID      string          `json:"task_id"`
	Outcome     string          `json:"outcome"`
	Reward      *float64        `json:"reward,omitempty"`
	Steps       int             `json:"steps"`
	Attempts    int             `json:"attempts"`
	Attribution *Attribution    `json:"attribution,omitempty"`
	RecordingID string          `json:"recording_id,omitempty"`
	Episodes    []EpisodeResult `json:"episodes"`
}

// FaultCount counts episodes ended by one code.
type FaultCount struct {
	Source string `json:"source"`
	Code   string `json:"code"`
	Count  int    `json:"count"`
}

// Latency is a distribution of step round trips, in milliseconds.
type Latency struct {
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// Summary is the result of a run.
type Summary struct {
	Tasks []TaskResult `json:"tasks"`
	// Total counts tasks; Success ... Canceled count their final outcomes
	// and add up to Total.
	Total    int `json:"total"`
	Success  int `json:"success"`
	Failure  int `json:"failure"`
	EnvError int `json:"env_error"`
	Error    int `json:"error"`
	Canceled int `json:"canceled"`
	// SuccessRate is Success over the tasks the environment let the
	// policy finish: success, failure and error (the policy's own faults
	// count against it); env_error and canceled tasks are left out. Zero
	// when there are none.
	SuccessRate float64 `json:"success_rate"`
	// Episodes counts every episode, re-queued ones included; Requeued
	// counts the re-queues.
	Episodes int `json:"episodes"`
	Requeued int `json:"requeued"`
	// EnvErrors counts every env_error episode (re-queued ones included)
	// by the source and code of its attribution, most frequent first.
	EnvErrors []FaultCount `json:"env_errors"`
	// Errors counts the episodes that ended error, likewise.
	Errors      []FaultCount `json:"errors"`
	Steps       int          `json:"steps"`
	StepLatency Latency      `json:"step_latency"`
	// ElapsedS is the run's wall time in seconds; EpisodesPerMinute the
	// episodes that ended per minute of it.
	ElapsedS          float64 `json:"elapsed_s"`
	EpisodesPerMinute float64 `json:"episodes_per_minute"`
}

// Summarize computes a Summary from task results and the run's wall time.
func Summarize(results []TaskResult, elapsed time.Duration) Summary {
	s := Summary{Tasks: results, Total: len(results), ElapsedS: elapsed.Seconds(), EnvErrors: []FaultCount{}, Errors: []FaultCount{}}
	var lat []float64
	envErrs, errs := map[[2]string]int{}, map[[2]string]int{}
	for _, t := range results {
		switch t.Outcome {
		case OutcomeSuccess:
			s.Success++
		case OutcomeFailure:
			s.Failure++
		case OutcomeEnvError:
			s.EnvError++
		case OutcomeError:
			s.Error++
		default:
			s.Canceled++
		}
		if len(t.Episodes) > 1 {
			s.Requeued += len(t.Episodes) - 1
		}
		for _, e := range t.Episodes {
			if e.Outcome == OutcomeCanceled && e.EpisodeID == "" {
				continue // never started
			}
			s.Episodes++
			s.Steps += e.Steps
			lat = append(lat, e.StepMS...)
			key := [2]string{"unknown", "unknown"}
			if a := e.Attribution; a != nil {
				key = [2]string{string(a.Source), a.Code}
			}
			switch e.Outcome {
			case OutcomeEnvError:
				envErrs[key]++
			case OutcomeError:
				errs[key]++
			}
		}
	}
	if n := s.Success + s.Failure + s.Error; n > 0 {
		s.SuccessRate = float64(s.Success) / float64(n)
	}
	s.EnvErrors, s.Errors = faultCounts(envErrs), faultCounts(errs)
	s.StepLatency = latencyOf(lat)
	if elapsed > 0 {
		s.EpisodesPerMinute = float64(s.Episodes) / elapsed.Minutes()
	}
	return s
}

func faultCounts(m map[[2]string]int) []FaultCount {
	out := make([]FaultCount, 0, len(m))
	for k, n := range m {
		out = append(out, FaultCount{Source: k[0], Code: k[1], Count: n})
	}
	slices.SortFunc(out, func(a, b FaultCount) int {
		return cmp.Or(b.Count-a.Count, strings.Compare(a.Source, b.Source), strings.Compare(a.Code, b.Code))
	})
	return out
}

// latencyOf is the distribution of samples (ms).
func latencyOf(samples []float64) Latency {
	s := slices.Clone(samples)
	slices.Sort(s)
	l := Latency{P50: Percentile(s, 50), P90: Percentile(s, 90), P99: Percentile(s, 99)}
	if len(s) > 0 {
		l.Max = s[len(s)-1]
	}
	return l
}

// Percentile is the nearest-rank p-th percentile (0 < p ≤ 100) of sorted:
// the smallest sample at or above p percent of them. Zero when empty.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// WriteTable writes the summary as a table of tasks followed by the totals.
func (s Summary) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tOUTCOME\tREWARD\tSTEPS\tATTEMPTS\tATTRIBUTION")
	for _, t := range s.Tasks {
		reward := "-"
		if t.Reward != nil {
			reward = strconv.FormatFloat(*t.Reward, 'g', 3, 64)
		}
		att := ""
		if a := t.Attribution; a != nil {
			att = fmt.Sprintf("%s/%s at step %d", a.Source, a.Code, a.Step)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", t.TaskID, t.Outcome, reward, t.Steps, t.Attempts, att)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d %s: %d success, %d failure, %d env_error, %d error", s.Total, plural(s.Total, "task"), s.Success, s.Failure, s.EnvError, s.Error)
	if s.Canceled > 0 {
		fmt.Fprintf(&b, ", %d canceled", s.Canceled)
	}
	fmt.Fprintf(&b, "; success rate %.1f%%\n", 100*s.SuccessRate)
	fmt.Fprintf(&b, "%d %s (%d re-queued), %d steps; step latency p50 %s p90 %s p99 %s; %.1f episodes/min over %s\n",
		s.Episodes, plural(s.Episodes, "episode"), s.Requeued, s.Steps, fmtMS(s.StepLatency.P50), fmtMS(s.StepLatency.P90), fmtMS(s.StepLatency.P99),
		s.EpisodesPerMinute, (time.Duration(s.ElapsedS * float64(time.Second))).Round(100*time.Millisecond))
	for _, g := range []struct {
		name string
		list []FaultCount
	}{{"env_error", s.EnvErrors}, {"error", s.Errors}} {
		if len(g.list) == 0 {
			continue
		}
		parts := make([]string, len(g.list))
		for i, c := range g.list {
			parts[i] = fmt.Sprintf("%s/%s ×%d", c.Source, c.Code, c.Count)
		}
		fmt.Fprintf(&b, "%s by cause: %s\n", g.name, strings.Join(parts, ", "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func fmtMS(ms float64) string {
	if ms >= 1000 {
		return strconv.FormatFloat(ms/1000, 'f', 2, 64) + "s"
	}
	return strconv.FormatFloat(ms, 'f', 0, 64) + "ms"
}
