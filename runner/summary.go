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
	TaskID string `json:"task_id"`
	// Attempt numbers the task's episodes in the run, from 1; Sample is
	// the sample (of Config.Samples) the episode was run for, from 1.
	Attempt int `json:"attempt"`
	Sample  int `json:"sample"`
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

// TaskResult is a task's result: its best sample's final episode's (its
// last episode's when it has one sample), with every episode it took
// (more than one when env_error episodes were re-queued or it has more
// samples).
type TaskResult struct {
	TaskID      string          `json:"task_id"`
	Outcome     string          `json:"outcome"`
	Reward      *float64        `json:"reward,omitempty"`
	Steps       int             `json:"steps"`
	Attempts    int             `json:"attempts"`
	Attribution *Attribution    `json:"attribution,omitempty"`
	RecordingID string          `json:"recording_id,omitempty"`
	Episodes    []EpisodeResult `json:"episodes"`
	// Scored (n) counts the samples whose final episode ended success,
	// failure or error, Passed (c) those that ended success; PassAtK is
	// {"pass@1": c/n, "pass@K": 1 - C(n-c,K)/C(n,K)} (Summary.PassAtK),
	// absent when n is 0.
	Scored  int                `json:"scored"`
	Passed  int                `json:"passed"`
	PassAtK map[string]float64 `json:"pass_at_k,omitempty"`
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
	// counts the re-queues (episodes beyond the first of each attempt).
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
	// Attempts is K, the samples each task was given (Config.Samples);
	// PassAtK is {"pass@1": x, "pass@K": y}, each the mean over the tasks
	// with a scored sample of the task's own (TaskResult.PassAtK): the
	// unbiased estimator 1 - C(n-c,k)/C(n,k) of Chen et al. (2021), n the
	// task's scored samples, c those that succeeded. Episodes that ended
	// env_error are not samples (they were the environment's), nor are
	// canceled ones; an episode that ended error (the policy's fault)
	// is a failed sample. When env_errors leave a task fewer than K
	// samples, its pass@K is the estimator at k = n: whether any passed.
	// Empty when no task has a scored sample.
	Attempts int                `json:"attempts"`
	PassAtK  map[string]float64 `json:"pass_at_k"`
}

// PassAtK is the unbiased estimator of pass@k from n samples of which c
// passed: the chance that at least one of k samples drawn from the n
// without replacement passed, 1 - C(n-c,k)/C(n,k). k above n is taken as
// n. Zero when n is 0.
func PassAtK(n, c, k int) float64 {
	if n <= 0 || c <= 0 {
		return 0
	}
	k = min(max(k, 1), n)
	if n-c < k {
		return 1
	}
	// C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i), stable for any n.
	p := 1.0
	for i := n - c + 1; i <= n; i++ {
		p *= 1 - float64(k)/float64(i)
	}
	return 1 - p
}

// passAtKNames are the keys of a PassAtK map for k samples.
func passAtKNames(k int) (string, string) { return "pass@1", "pass@" + strconv.Itoa(k) }

// ScorePassAtK sets s.Attempts to k and scores pass@1 and pass@k per
// task, from each sample's final episode, and over the tasks.
func (s *Summary) ScorePassAtK(k int) {
	k = max(k, 1)
	s.Attempts = k
	s.PassAtK = map[string]float64{}
	k1, kk := passAtKNames(k)
	var sum1, sumK float64
	tasks := 0
	for i := range s.Tasks {
		t := &s.Tasks[i]
		final := map[int]EpisodeResult{}
		for _, e := range t.Episodes {
			final[max(e.Sample, 1)] = e // episodes are kept in the order they ended
		}
		t.Scored, t.Passed, t.PassAtK = 0, 0, nil
		for _, e := range final {
			switch e.Outcome {
			case OutcomeSuccess:
				t.Passed++
				t.Scored++
			case OutcomeFailure, OutcomeError:
				t.Scored++
			}
		}
		if t.Scored == 0 {
			continue
		}
		t.PassAtK = map[string]float64{k1: PassAtK(t.Scored, t.Passed, 1), kk: PassAtK(t.Scored, t.Passed, k)}
		sum1 += t.PassAtK[k1]
		sumK += t.PassAtK[kk]
		tasks++
	}
	if tasks > 0 {
		s.PassAtK[k1], s.PassAtK[kk] = sum1/float64(tasks), sumK/float64(tasks)
	}
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
		// A re-queue is an episode beyond the first of its sample.
		samples := map[int]bool{}
		for _, e := range t.Episodes {
			samples[max(e.Sample, 1)] = true
		}
		if len(t.Episodes) > len(samples) {
			s.Requeued += len(t.Episodes) - len(samples)
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
	k1, kk := passAtKNames(max(s.Attempts, 1))
	if s.Attempts > 1 {
		fmt.Fprintf(tw, "TASK\tOUTCOME\tREWARD\tSTEPS\tATTEMPTS\tPASSED\t%s\t%s\tATTRIBUTION\n", strings.ToUpper(k1), strings.ToUpper(kk))
	} else {
		fmt.Fprintln(tw, "TASK\tOUTCOME\tREWARD\tSTEPS\tATTEMPTS\tATTRIBUTION")
	}
	for _, t := range s.Tasks {
		reward := "-"
		if t.Reward != nil {
			reward = strconv.FormatFloat(*t.Reward, 'g', 3, 64)
		}
		att := ""
		if a := t.Attribution; a != nil {
			att = fmt.Sprintf("%s/%s at step %d", a.Source, a.Code, a.Step)
		}
		if s.Attempts > 1 {
			p1, pk := "-", "-"
			if t.PassAtK != nil {
				p1, pk = strconv.FormatFloat(t.PassAtK[k1], 'f', 3, 64), strconv.FormatFloat(t.PassAtK[kk], 'f', 3, 64)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d/%d\t%s\t%s\t%s\n", t.TaskID, t.Outcome, reward, t.Steps, t.Attempts, t.Passed, t.Scored, p1, pk, att)
			continue
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
	if k1, kk := passAtKNames(max(s.Attempts, 1)); len(s.PassAtK) > 0 {
		if s.Attempts > 1 {
			fmt.Fprintf(&b, "%s %.3f, %s %.3f over %d attempts per task (env_error episodes not counted)\n", k1, s.PassAtK[k1], kk, s.PassAtK[kk], s.Attempts)
		} else {
			fmt.Fprintf(&b, "%s %.3f (env_error episodes not counted)\n", k1, s.PassAtK[k1])
		}
	}
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
