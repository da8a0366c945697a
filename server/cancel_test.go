package server_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// startJob starts a command without waiting and returns its job id.
func startJob(t *testing.T, srv *testserver.Server, id, command string) string {
	t.Helper()
	r := call(t, srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": command})
	want(t, r, 200)
	return r.body["job_id"].(string)
}

// jobOf decodes a job response.
func jobOf(t *testing.T, r resp) api.Job {
	t.Helper()
	var j api.Job
	if err := json.Unmarshal(r.raw, &j); err != nil {
		t.Fatal(err)
	}
	return j
}

// awaitJobState polls a job until ok says yes, or fails after 20 s.
func awaitJobState(t *testing.T, srv *testserver.Server, jobID string, ok func(api.Job) bool) api.Job {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		j := jobOf(t, call(t, srv, "GET", "/jobs/"+jobID, nil))
		if ok(j) {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s never reached the state awaited: %+v", jobID, j)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wantCanceled checks a job ended by a cancel, keeping the output it had.
func wantCanceled(t *testing.T, j api.Job, stdout string) {
	t.Helper()
	if j.Status != api.JobFailed || j.Fault == nil || j.Fault.Code != faults.CodeJobCanceled ||
		j.Error == nil || *j.Error != "Command was canceled by request" || !j.CancelRequested ||
		j.ExitCode != nil || j.CompletedAt == nil || j.Stdout != stdout {
		t.Fatalf("canceled job: %+v (want failed, %s, stdout %q)", j, faults.CodeJobCanceled, stdout)
	}
}

// awaitNoProcess waits until no process of the sandbox runs a program
// called name: a canceled command dies with its whole process group.
func awaitNoProcess(t *testing.T, srv *testserver.Server, id, name string) {
	t.Helper()
	probe := testenv.ProcessesNamed(name)
	deadline := time.Now().Add(10 * time.Second)
	for {
		j := execWait(t, srv, id, map[string]any{"command": probe})
		if j.Status == api.JobSucceeded && j.Stdout == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still runs after its job was canceled: %+v", name, j)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestCancelJob(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "256Mi"})

	t.Run("running", func(t *testing.T) {
		// The sleep is in a pipeline's subshell: a process of the group
		// other than the one the agent started must die too.
		jobID := startJob(t, srv, id, "echo started; (sleep 60; echo late) | cat; echo after")
		awaitJobState(t, srv, jobID, func(j api.Job) bool { return j.Stdout == "started\n" })
		start := time.Now()
		r := call(t, srv, "POST", "/jobs/"+jobID+"/cancel", nil)
		want(t, r, 200)
		wantCanceled(t, jobOf(t, r), "started\n")
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("cancel took %v", d)
		}
		// The stored job is the one returned.
		wantCanceled(t, jobOf(t, call(t, srv, "GET", "/jobs/"+jobID, nil)), "started\n")
		awaitNoProcess(t, srv, id, "sleep")
		// Cancelling again changes nothing.
		wantCanceled(t, jobOf(t, call(t, srv, "POST", "/jobs/"+jobID+"/cancel", nil)), "started\n")
	})

	t.Run("queued behind another", func(t *testing.T) {
		first := startJob(t, srv, id, "sleep 60")
		awaitJobState(t, srv, first, func(j api.Job) bool { return j.Status == api.JobRunning })
		second := startJob(t, srv, id, "echo second")
		r := call(t, srv, "POST", "/jobs/"+second+"/cancel", nil)
		want(t, r, 200)
		wantCanceled(t, jobOf(t, r), "")
		if j := jobOf(t, call(t, srv, "GET", "/jobs/"+first, nil)); j.Status != api.JobRunning || j.CancelRequested {
			t.Fatalf("cancelling a queued job touched the one running: %+v", j)
		}
		wantCanceled(t, jobOf(t, call(t, srv, "POST", "/jobs/"+first+"/cancel", nil)), "")
		// The sandbox runs the next command as usual.
		if j := execWait(t, srv, id, map[string]any{"command": "echo next"}); j.Status != api.JobSucceeded || j.Stdout != "next\n" {
			t.Fatalf("exec after cancels: %+v", j)
		}
	})

	t.Run("a waiting exec gets the canceled job", func(t *testing.T) {
		got := make(chan resp, 1)
		go func() {
			got <- call(t, srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "echo waiting; sleep 61", "wait": true})
		}()
		var jobID string
		deadline := time.Now().Add(20 * time.Second)
		for jobID == "" && time.Now().Before(deadline) {
			jobs, err := srv.Manager.Store().ListJobs(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, j := range jobs {
				if strings.HasSuffix(j.Command, "sleep 61") && j.Stdout == "waiting\n" {
					jobID = j.JobID
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		if jobID == "" {
			t.Fatal("the waiting exec's job never showed its output")
		}
		want(t, call(t, srv, "POST", "/jobs/"+jobID+"/cancel", nil), 200)
		select {
		case r := <-got:
			want(t, r, 200)
			wantCanceled(t, jobOf(t, r), "waiting\n")
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting exec did not return after its job was canceled")
		}
	})

	t.Run("finished is unchanged", func(t *testing.T) {
		j := execWait(t, srv, id, map[string]any{"command": "echo done"})
		r := call(t, srv, "POST", "/jobs/"+j.JobID+"/cancel", nil)
		want(t, r, 200)
		if c := jobOf(t, r); c.Status != api.JobSucceeded || c.Stdout != "done\n" || c.CancelRequested || c.Fault != nil {
			t.Fatalf("cancel of a finished job changed it: %+v", c)
		}
	})

	t.Run("unknown job", func(t *testing.T) {
		r := call(t, srv, "POST", "/jobs/no-such-job/cancel", nil)
		want(t, r, 404)
		if r.body["detail"] != "Job no-such-job not found" {
			t.Fatalf("unknown job: %s", r.raw)
		}
	})

	t.Run("needs the key", func(t *testing.T) {
		want(t, call(t, srv, "POST", "/jobs/no-such-job/cancel", nil, ""), 401)
	})
}
