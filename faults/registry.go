package faults

import "strconv"

// CodeInfo describes one stable code: the class it usually carries and what
// it means. Category and Source are the ones the code is created with in the
// common case; a producer that knows better may give the same code another
// source, and the source on the error wins.
type CodeInfo struct {
	Code      string
	Category  Category
	Source    Source
	Retryable bool
	// EnvError reports whether an episode that ends on this fault ends
	// `env_error`: the environment failed (sandbox, browser, desktop,
	// network, platform, task, or a site that is down), so the episode is
	// re-queued and never learned from. False for the policy's own
	// failures, which are training signal, and for client errors, which are
	// bugs in the caller rather than episode outcomes.
	EnvError bool
	Doc      string
}

// registry lists every code in codes.go. A test parses codes.go and fails
// when a code is missing here, so a new code cannot ship undescribed.
//
// Columns: Code, Category, Source, Retryable, EnvError, Doc.
var registry = []CodeInfo{
	// Client mistakes: the caller's bugs, never an episode outcome.
	{CodeInvalidJSON, InvalidRequest, Client, false, false, "The request body is not valid JSON."},
	{CodeValidation, InvalidRequest, Client, false, false, "A request field is missing, malformed or out of range."},
	{CodeTooLarge, TooLarge, Client, false, false, "The request body exceeds the server's size limit."},
	{CodeUnauthenticated, Unauthenticated, Client, false, false, "The request has no API key and the server requires one."},
	{CodeForbidden, PermissionDenied, Client, false, false, "The API key is not one the server accepts."},
	{CodeRouteNotFound, NotFound, Client, false, false, "No route matches the request path."},
	{CodeMethodNotAllowed, InvalidRequest, Client, false, false, "The route does not accept the request's method."},
	{CodeCanceled, Canceled, Client, false, false, "The caller canceled the operation or went away."},
	{CodeResponseTooLarge, TooLarge, Client, false, false, "A response exceeded the client's size bound."},
	{CodeFaultPlanInvalid, InvalidRequest, Client, false, false, "A fault plan names an unknown kind or has a field out of range."},
	{CodeLimitExceeded, InvalidRequest, Client, false, false, "A request field asks for more than this server gives: cpu or memory above the host's " +
		"or the configured maximum (ORCHARD_MAX_CPU, ORCHARD_MAX_MEMORY). The value is well-formed; a server with more room may take it."},

	// Records the caller names.
	{CodeSandboxNotFound, NotFound, Client, false, false, "No sandbox has that id: it was never created, was deleted, or expired."},
	{CodeJobNotFound, NotFound, Client, false, false, "No job has that id."},
	{CodeJobCanceled, Canceled, Client, false, false, "The job was canceled by request (POST /jobs/{id}/cancel) before it finished; its command was killed."},
	{CodeSandboxExists, Conflict, Client, false, false, "A sandbox with that id already exists."},
	{CodePoolNotFound, NotFound, Client, false, false, "No warm pool has that name."},
	{CodePoolExists, Conflict, Client, false, false, "A warm pool with that name already exists (or is being created by another request)."},
	{CodePoolMismatch, InvalidRequest, Client, false, false, "The create names a pool whose sandboxes differ in a setting a claim cannot change (the field is in the detail's loc); create without pool, or with a pool of that spec."},
	{CodeSandboxNotReady, Conflict, Client, false, false, "The sandbox has not finished starting; wait for it before using it."},
	{CodeSandboxPaused, Conflict, Client, false, false, "The sandbox is paused: its processes are stopped in place. Resume it (POST /sandboxes/{id}/resume) before exec, files or actions."},
	{CodeSnapshotNotFound, NotFound, Client, false, false, "No snapshot has that id: it was never taken or was deleted."},
	{CodeSnapshotTooLarge, TooLarge, Client, false, false, "The sandbox's filesystem changes exceed the snapshot size cap (ORCHARD_SNAPSHOT_MAX_BYTES); remove files or raise the cap."},
	{CodeSnapshotUnavailable, NotImplemented, Client, false, false, "This sandbox cannot be snapshotted or forked: the runtime has no snapshots (Kubernetes), or the sandbox was started by an earlier server process."},
	{CodeSandboxGone, Canceled, Client, false, false, "The sandbox was deleted while work on it was starting or running."},

	// Service endpoints.
	{CodeServicePortInvalid, InvalidRequest, Client, false, false, "The port cannot be exposed: it is outside 1-65535 or reserved for the sandbox's agent or egress proxy."},
	{CodeServiceNotExposed, NotFound, Client, false, false, "The sandbox does not expose that port (never exposed, or revoked)."},
	{CodeServiceTokenInvalid, PermissionDenied, Client, false, false, "The service URL is not valid: its token is unknown, expired or revoked, or its sandbox is gone."},
	{CodeServiceUnreachable, Unavailable, Sandbox, true, true, "Nothing accepts connections on the exposed port inside the sandbox, or the connection to it broke."},
	{CodeServiceNotReady, Timeout, Sandbox, true, true, "The service did not answer its health path with a 2xx within ready_timeout."},
	{CodeServiceTimeout, Timeout, Sandbox, true, true, "The service did not answer a proxied request in time."},

	// Sandbox lifetime and agent.
	{CodeAgentNotReady, Unavailable, Sandbox, true, true, "The sandbox's agent has not answered its health check yet."},
	{CodeAgentUnreachable, Unavailable, Sandbox, true, true, "The sandbox's agent could not be reached or its connection broke."},
	{CodeAgentDied, Unavailable, Sandbox, true, true, "The sandbox's agent process died."},
	{CodeSandboxDied, Unavailable, Sandbox, true, true, "The sandbox stopped: its processes exited or the runtime lost it."},
	{CodeOOM, ActionFailed, Sandbox, false, true, "The sandbox or the command was killed for exceeding the sandbox's memory limit."},
	{CodeSandboxEvicted, Unavailable, Sandbox, true, true, "The sandbox's node evicted it (node out of memory or disk, or drained): its state is gone; create another."},
	{CodePidsLimit, ActionFailed, Sandbox, false, true, "A command could not start because the sandbox's process limit is reached."},
	{CodeExecTimeout, Timeout, Policy, false, false, "A command ran past its own timeout and was killed; the command was the caller's choice. " +
		"Comes with source sandbox when the agent stopped answering past that bound."},
	{CodeExecKilled, ActionFailed, Sandbox, false, true, "A command was killed by a signal it did not send itself."},
	{CodeWaitTimeout, Timeout, Sandbox, true, true, "The sandbox did not become ready within the time allowed."},
	{CodeSpawnFailed, ActionFailed, Sandbox, false, true, "A command could not be started in the sandbox."},
	{CodePTYFailed, Internal, Sandbox, false, true, "An interactive PTY session ended with an error."},

	// Files and patches inside a sandbox.
	{CodeFileNotFound, NotFound, Client, false, false, "The file does not exist."},
	{CodePathNotFound, NotFound, Client, false, false, "A directory on the path does not exist; for an exec, its cwd."},
	{CodeIsDirectory, InvalidRequest, Client, false, false, "The path is a directory where a file was expected."},
	{CodeNotDirectory, InvalidRequest, Client, false, false, "The path is a file where a directory was expected (an exec's cwd, say)."},
	{CodePathEscape, InvalidRequest, Client, false, false, "The path leads outside the sandbox's file system."},
	{CodeInvalidBase64, InvalidRequest, Client, false, false, "File content is not valid base64."},
	{CodeFilePermission, PermissionDenied, Client, false, false, "The sandbox user may not read or write the path."},
	{CodeNotRegular, InvalidRequest, Client, false, false, "The path is not a regular file (a device, socket or pipe)."},
	{CodeSymlinkLoop, InvalidRequest, Client, false, false, "The path has too many levels of symbolic links."},
	{CodeReadOnly, PermissionDenied, Client, false, false, "The path is on a read-only mount (the sandbox's agent binary, /proc/sys, /sys) " +
		"or a file system that takes no new files; nothing can be written there."},
	{CodeFileIO, Internal, Sandbox, false, true, "Reading or writing a file inside the sandbox failed."},
	{CodeGitMissing, InvalidRequest, Task, false, true, "Applying a patch needs git, and the sandbox image has none."},

	// Runtime and images.
	{CodeCreateFailed, Internal, Platform, false, true, "The runtime could not create the sandbox."},
	{CodeCapacity, Capacity, Platform, true, true, "The host has no room for another sandbox; retry later or elsewhere."},
	{CodeKindUnsupported, NotImplemented, Client, false, false, "This server does not offer the requested sandbox kind or operation."},
	{CodeNetworkEgressOff, NotImplemented, Client, false, false, "This server cannot enforce the requested egress settings."},
	{CodeKubeAPI, Unavailable, Platform, true, true, "The Kubernetes API server refused or did not answer the runtime (rate limited, overloaded, unreachable) after its retries."},
	{CodeImageRef, InvalidRequest, Client, false, false, "The image reference cannot be parsed."},
	{CodeImageNotFound, NotFound, Client, false, false, "The image does not exist, or has no variant for this architecture."},
	{CodeImagePull, Unavailable, Network, true, true, "Pulling the image from its registry failed."},
	{CodeImageUnpack, Internal, Platform, false, true, "The image was fetched but could not be unpacked."},
	{CodeImagePathNotAllowed, PermissionDenied, Client, false, false, "An `oci-layout:` or `docker-archive:` path lies outside the directories the server reads local images from " +
		"(`ORCHARD_IMAGE_DIRS`; none by default), once its symlinks and `..` are resolved."},
	{CodeImagePathNotRegular, InvalidRequest, Client, false, false, "A local image path is not what its reference needs: a regular file for `docker-archive:`, " +
		"a directory of regular files for `oci-layout:`; not a device, pipe or socket, nor a link to one or to a directory."},

	// Platform: the server, its store and its client.
	{CodeInternal, Internal, Platform, false, true, "An unexpected error in Orchard itself."},
	{CodeTimeout, Timeout, Platform, true, true, "An operation inside the platform ran out of time."},
	{CodeMisconfigured, Internal, Platform, false, true, "The server or agent is misconfigured."},
	{CodeStoreUnavailable, Unavailable, Platform, true, true, "The state store (Redis) is unreachable or failing."},
	{CodeShuttingDown, Unavailable, Platform, true, true, "The server or runtime is shutting down."},
	{CodeSandboxElsewhere, Conflict, Platform, true, true, "This replica cannot reach the sandbox's container: another replica, on another host or with another state directory, made it. " +
		"A delete marks it deleting and the replica that reaches it finishes the delete; other calls may succeed through that replica."},
	{CodeUploadsBusy, Capacity, Platform, true, true, "The server is receiving as many large uploads as it allows at once and the request waited too long for a turn; " +
		"retry after the Retry-After delay."},
	{CodeUnreachable, Unavailable, Platform, true, true, "The server could not be reached, or the connection broke before it answered."},
	{CodeBadResponse, Internal, Platform, false, true, "The server answered with a body the client cannot decode."},
	{CodeLockLost, Conflict, Platform, false, true, "A lock's lease expired or another replica took it, so a write under it was refused."},
	{CodeJobLost, Unavailable, Platform, true, true, "The replica running a job stopped before the job finished; the command's outcome is unknown."},

	// Browser and desktop.
	{CodeBrowserCrashed, Unavailable, Browser, true, true, "The browser process died or its connection broke."},
	{CodeBrowserTabCrashed, Unavailable, Browser, true, true, "A tab's renderer crashed; navigating revives it."},
	{CodeBrowserTimeout, Timeout, Browser, true, true, "The browser did not answer a command in time."},
	{CodeBrowserHung, Unavailable, Browser, true, true, "The browser stopped answering and was restarted."},
	{CodeBrowserProtocol, Internal, Browser, false, true, "The browser answered a command with an error no better code fits."},
	{CodeBrowserLaunch, Unavailable, Browser, true, true, "The browser could not be started."},
	{CodeBrowserClosed, Unavailable, Browser, false, false, "The browser session was closed by its owner; no environment fault."},
	{CodeBrowserStateTooLarge, TooLarge, Browser, false, true, "The browser's saved state (cookies, storage, tabs) exceeds the 32 MiB a snapshot carries, " +
		"on export, or a state given to import does."},
	{CodeDesktopXDied, Unavailable, Desktop, true, true, "The X server of a desktop sandbox died."},
	{CodeDesktopWMDied, Unavailable, Desktop, true, true, "The window manager of a desktop sandbox died and was restarted, or, after dying repeatedly, " +
		"left for good (not retryable then). Input and screenshots work without it: the fault is reported in the desktop's status and the next actions response."},
	{CodeDesktopLaunch, Unavailable, Desktop, true, true, "The desktop (X server, window manager, apps) could not be started."},

	// Episodes and their evaluation.
	{CodeJudgeFailed, Unavailable, Platform, true, true, "The LLM judge could not be reached or gave no usable verdict; the episode ends env_error, never failure."},
	{CodeTaskNotFound, NotFound, Task, false, true, "No loaded task has the id."},
	{CodeTaskInvalid, InvalidRequest, Task, false, true, "A task file or task is malformed (the line number is in the message)."},
	{CodeTaskSetupFailed, Unavailable, Task, true, true, "A task's setup (files to write, commands to run) failed in the sandbox."},
	{CodeEpisodeNotFound, NotFound, Client, false, false, "No episode has the id."},
	{CodeEpisodeDone, Conflict, Client, false, false, "The episode has ended and takes no more steps."},
	{CodeEpisodeDeadline, Timeout, Policy, false, false, "The episode ran past its deadline or its step limit."},
	{CodeRecordingNotFound, NotFound, Client, false, false, "No recording has the id, or the recording has no such step or screenshot."},

	// Actions the policy asks for: its own failures, kept as signal.
	{CodeActionInvalid, InvalidRequest, Policy, false, false, "The action is malformed or cannot apply to its target (a disabled element, say)."},
	{CodeActionNoSuchElement, ActionFailed, Policy, false, false, "No element matches the action's target."},
	{CodeActionStaleElement, ActionFailed, Policy, false, false, "The element id comes from an earlier page; observe again."},
	{CodeActionStaleFrame, Conflict, Policy, false, false, "A strict action named an observation frame that is no longer the latest."},
	{CodeActionNoSuchTab, ActionFailed, Policy, false, false, "No tab has that id."},
	{CodeActionNoSuchOpt, ActionFailed, Policy, false, false, "The select element has no such option."},
	{CodeActionNoDialog, ActionFailed, Policy, false, false, "The action answers a dialog, and none is open."},
	{CodeActionDialogOpen, Conflict, Policy, false, false, "A dialog is open and must be answered first."},
	{CodeActionNotEditable, ActionFailed, Policy, false, false, "The element does not accept text."},

	// Navigations and the sites they reach.
	{CodeSiteHTTPPrefix, ActionFailed, Site, false, false, "The main document answered with an HTTP error status, appended to the code (site.http_404). " +
		"5xx and 429 are the site's transient faults: unavailable, retryable, env_error. " +
		"Other 4xx are the site's answer to what the policy asked."},
	{CodeSiteDNS, Unavailable, Site, true, true, "The site's name does not resolve."},
	{CodeSiteConnectionRefused, Unavailable, Site, true, true, "The site refused the connection."},
	{CodeSiteConnectionReset, Unavailable, Site, true, true, "The site reset the connection."},
	{CodeSiteConnectionClosed, Unavailable, Site, true, true, "The site closed the connection without a response."},
	{CodeSiteTLS, Unavailable, Site, false, true, "The site's TLS certificate or handshake is bad; retrying will not fix it."},
	{CodeSiteTimeout, Timeout, Site, true, true, "The site did not answer in time."},
	{CodeSiteUnreachable, Unavailable, Site, true, true, "The site's address cannot be reached."},
	{CodeSiteBlocked, PermissionDenied, Site, false, true, "The site answered with a bot wall or a CAPTCHA."},
	{CodeSiteUnavailable, Unavailable, Site, true, true, "The site's circuit breaker is open after repeated failures; the request failed fast."},
	{CodeSiteRateLimited, Capacity, Site, true, true, "The per-host rate limit held the request back longer than its deadline allows."},
	{CodeNavigationFailed, Unavailable, Site, true, true, "Loading the page failed for a reason no better code fits."},
	{CodeNavigationTimeout, Timeout, Site, true, true, "The page did not finish loading in time."},
	{CodeNavigationAborted, ActionFailed, Site, false, false, "The navigation was aborted (another navigation or a download replaced it)."},
	{CodeNavigationBlocked, ActionFailed, Policy, false, false, "The browser refused the URL (a blocked scheme, port or host)."},
	{CodeNavigationInvalidURL, InvalidRequest, Policy, false, false, "The URL is malformed or its scheme unknown."},
	{CodeNavigationNoHistory, ActionFailed, Policy, false, false, "There is no page to go back or forward to."},

	// Network and egress.
	{CodeNetworkOffline, Unavailable, Network, true, true, "The sandbox has no network connection."},
	{CodeNetworkProxy, Unavailable, Network, true, true, "The proxy in front of the sandbox failed."},
	{CodeNetworkDNS, Unavailable, Network, true, true, "The resolver itself failed (timeout, SERVFAIL, no server reachable)."},
	{CodeEgressUnavailable, Unavailable, Network, true, true, "The sandbox's egress tunnel to the server is down."},
	{CodeEgressDenied, PermissionDenied, Policy, false, false, "The host is not on the sandbox's egress allow-list."},
	{CodeEgressPrivate, PermissionDenied, Policy, false, false, "The host resolves to a loopback, link-local or private address, which sandboxes may not reach."},

	// Policies the batch runner drives: the agent under test, so never env_error.
	{CodePolicyEndpointFailed, Unavailable, Policy, true, false, "A policy served at a URL could not be reached, timed out or answered 5xx after its retries; " +
		"the policy's failure, not the environment's, so the episode is not re-queued."},
	{CodePolicyBadResponse, InvalidRequest, Policy, false, false, "A policy endpoint answered with something other than an action (a 4xx, not JSON, no action object)."},
	{CodePolicyNoScript, NotFound, Policy, false, false, "The scripted policy has no script for the task."},
	{CodePolicyFailed, Internal, Policy, false, false, "A policy returned an error it did not classify."},
}

// index maps each code to its entry in registry.
var index = func() map[string]int {
	m := make(map[string]int, len(registry))
	for i, c := range registry {
		m[c.Code] = i
	}
	return m
}()

// Codes returns every stable code, in a fresh slice the caller may keep.
// The entry for CodeSiteHTTPPrefix describes the family of HTTP status
// codes; its fields are those of a 4xx member, and Lookup gives each member
// its own.
func Codes() []CodeInfo {
	return append([]CodeInfo(nil), registry...)
}

// Lookup returns the entry for code. A member of the HTTP status family
// ("site.http_503") gets the family's entry with its own code, and for 5xx
// and 429 the transient class: unavailable, retryable, env_error.
func Lookup(code string) (CodeInfo, bool) {
	if i, ok := index[code]; ok {
		return registry[i], true
	}
	status, ok := httpStatus(code)
	if !ok {
		return CodeInfo{}, false
	}
	c := registry[index[CodeSiteHTTPPrefix]]
	c.Code = code
	if status >= 500 || status == 429 {
		c.Category, c.Retryable, c.EnvError = Unavailable, true, true
	}
	if c.EnvError {
		c.Doc = "The main document answered with HTTP " + strconv.Itoa(status) + ", a transient fault of the site."
	} else {
		c.Doc = "The main document answered with HTTP " + strconv.Itoa(status) + ", the site's answer to what the policy asked."
	}
	return c, true
}

// httpStatus parses a member of the site HTTP family: the prefix and an
// error status, 400 to 599, in three digits.
func httpStatus(code string) (int, bool) {
	if len(code) != len(CodeSiteHTTPPrefix)+3 || code[:len(CodeSiteHTTPPrefix)] != CodeSiteHTTPPrefix {
		return 0, false
	}
	n, err := strconv.Atoi(code[len(CodeSiteHTTPPrefix):])
	if err != nil || n < 400 || n > 599 {
		return 0, false
	}
	return n, true
}
