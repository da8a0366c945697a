package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/retry"
)

// failure classifies why a pod cannot run (any more), or returns nil while
// it still can: image errors, an unschedulable pod, eviction, OOM, an
// agent that exited or could not start.
func failure(pod *corev1.Pod) *faults.Error {
	id := pod.Labels[LabelSandbox]
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		switch pod.Status.Reason {
		case "Evicted":
			return faults.Newf(faults.CodeSandboxEvicted, faults.Unavailable, faults.Sandbox,
				"sandbox %s was evicted: %s", id, pod.Status.Message)
		case "DeadlineExceeded":
			return faults.Newf(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox,
				"sandbox %s outlived its ttl_seconds and was stopped", id)
		}
		if t := terminated(pod, containerName); t != nil {
			if t.Reason == "OOMKilled" {
				return faults.Newf(faults.CodeOOM, faults.ActionFailed, faults.Sandbox, "sandbox %s was killed: out of memory", id)
			}
			return faults.Newf(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox,
				"sandbox %s: its agent exited (%s, code %d)", id, t.Reason, t.ExitCode)
		}
		if t := terminated(pod, initName); t != nil && t.ExitCode != 0 {
			return faults.Newf(faults.CodeCreateFailed, faults.Unavailable, faults.Platform,
				"sandbox %s: the agent could not be installed (%s, code %d)", id, t.Reason, t.ExitCode)
		}
		return faults.Newf(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox, "sandbox %s: its pod %s", id, strings.ToLower(string(pod.Status.Phase)))
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return faults.Newf(faults.CodeCapacity, faults.Capacity, faults.Platform,
				"no node can take sandbox %s now: %s", id, c.Message)
		}
	}
	statuses := append(append([]corev1.ContainerStatus(nil), pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...)
	for _, s := range statuses {
		w := s.State.Waiting
		if w == nil {
			continue
		}
		img := s.Image
		switch w.Reason {
		case "ErrImagePull", "ImagePullBackOff":
			if notFound(w.Message) {
				return faults.Newf(faults.CodeImageNotFound, faults.NotFound, faults.Client, "image %s not found: %s", img, w.Message)
			}
			return faults.Newf(faults.CodeImagePull, faults.Unavailable, faults.Network, "image %s could not be pulled: %s", img, w.Message)
		case "ErrImageNeverPull":
			return faults.Newf(faults.CodeImageNotFound, faults.NotFound, faults.Client, "image %s is not on the node and may not be pulled", img)
		case "InvalidImageName":
			return faults.Newf(faults.CodeImageRef, faults.InvalidRequest, faults.Client, "image %s is not a valid reference: %s", img, w.Message)
		case "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
			return faults.Newf(faults.CodeCreateFailed, faults.Unavailable, faults.Platform, "sandbox %s could not start: %s: %s", id, w.Reason, w.Message)
		}
	}
	return nil
}

// notFound tells a registry's "no such image" from a pull that failed.
func notFound(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "not found") || strings.Contains(m, "manifest unknown") || strings.Contains(m, "does not exist")
}

func terminated(pod *corev1.Pod, name string) *corev1.ContainerStateTerminated {
	for _, l := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for _, s := range l {
			if s.Name != name {
				continue
			}
			if s.State.Terminated != nil {
				return s.State.Terminated
			}
			return s.LastTerminationState.Terminated
		}
	}
	return nil
}

// reasonOf is runtime.Instance.Reason for a failed pod: what the manager's
// death classification reads ("oom", "evicted: ...", "exited: N").
func reasonOf(pod *corev1.Pod, f *faults.Error) string {
	switch f.Code {
	case faults.CodeOOM:
		return "oom"
	case faults.CodeSandboxEvicted:
		return "evicted: " + pod.Status.Message
	}
	if t := terminated(pod, containerName); t != nil {
		return fmt.Sprintf("exited: %d", t.ExitCode)
	}
	return f.Message
}

// describe says where a pod that is not ready is stuck, for a timeout.
func describe(pod *corev1.Pod) string {
	if pod.Spec.NodeName == "" {
		return "not scheduled yet"
	}
	for _, s := range append(append([]corev1.ContainerStatus(nil), pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if w := s.State.Waiting; w != nil {
			return fmt.Sprintf("container %s waiting: %s %s", s.Name, w.Reason, w.Message)
		}
	}
	if pod.Status.Phase == corev1.PodRunning {
		return "running, but its agent did not pass the readiness probe"
	}
	return "phase " + string(pod.Status.Phase)
}

// transient reports whether an API call may be repeated: rate limiting,
// server errors, timeouts and broken connections.
func transient(err error) bool {
	switch {
	case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsInternalError(err), apierrors.IsServiceUnavailable(err), apierrors.IsUnexpectedServerError(err):
		return true
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return se.Status().Code >= 500
	}
	var ne net.Error
	return errors.As(err, &ne) || faults.IsRetryable(err)
}

// apiFault classifies an API call's failure that retries did not cure.
func apiFault(err error, what string) error {
	var f *faults.Error
	if errors.As(err, &f) {
		return err
	}
	switch {
	case apierrors.IsForbidden(err):
		return faults.Wrap(err, faults.CodeMisconfigured, faults.Internal, faults.Platform,
			"the server may not "+what+" (RBAC)")
	case apierrors.IsInvalid(err):
		return faults.Wrap(err, faults.CodeCreateFailed, faults.InvalidRequest, faults.Client, "Kubernetes refused to "+what+": "+err.Error())
	case apierrors.IsNotFound(err):
		return faults.Wrap(err, faults.CodeMisconfigured, faults.Internal, faults.Platform, "cannot "+what+": "+err.Error())
	}
	return faults.Wrap(err, faults.CodeKubeAPI, faults.Unavailable, faults.Platform, "the Kubernetes API server did not "+what)
}

// callAPI runs an API call under the runtime's retry policy and returns
// the call's own last error (which apierrors can read), or the context's.
func callAPI(ctx context.Context, p retry.Policy, call func(ctx context.Context) error) error {
	res, err := retry.Do(ctx, p, func(ctx context.Context, _ int) error {
		err := call(ctx)
		// A 429 or 503 may say when to come back (Retry-After): sooner
		// is refused again, later wastes the caller's time.
		if secs, ok := apierrors.SuggestsClientDelay(err); ok && secs > 0 {
			return retry.WithRetryAfter(err, time.Duration(secs)*time.Second)
		}
		return err
	})
	if err == nil {
		return nil
	}
	if last := res.LastErr(); last != nil {
		return last
	}
	return err
}
