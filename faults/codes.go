package faults

// Stable codes. They are API: add, never rename. Each names its source as
// its first segment where the source is fixed.
const (
	// Client mistakes.
	CodeInvalidJSON      = "client.invalid_json"
	CodeValidation       = "client.validation"
	CodeTooLarge         = "client.body_too_large"
	CodeUnauthenticated  = "client.missing_api_key"
	CodeForbidden        = "client.invalid_api_key"
	CodeRouteNotFound    = "client.route_not_found"
	CodeMethodNotAllowed = "client.method_not_allowed"
	CodeCanceled         = "client.canceled"

	// Records.
	CodeSandboxNotFound = "sandbox.not_found"
	CodeJobNotFound     = "job.not_found"
	CodeJobCanceled     = "job.canceled"
	CodeSandboxExists   = "sandbox.exists"
	// Warm pools (POST /pools).
	CodePoolNotFound    = "pool.not_found"
	CodePoolExists      = "pool.exists"
	CodePoolMismatch    = "pool.spec_mismatch"
	CodeSandboxNotReady = "sandbox.not_ready"
	// CodeSandboxPaused: the sandbox is paused (POST /sandboxes/{id}/pause);
	// its processes, the agent among them, answer nothing until resumed.
	CodeSandboxPaused = "sandbox.paused"
	// CodeSnapshotNotFound: no snapshot has that id (never taken, deleted).
	CodeSnapshotNotFound = "snapshot.not_found"
	// CodeSnapshotTooLarge: the sandbox wrote more than a snapshot may keep.
	CodeSnapshotTooLarge = "snapshot.too_large"
	// CodeSnapshotUnavailable: this sandbox cannot be snapshotted or forked
	// (the runtime cannot, or the sandbox's writable layer is out of reach).
	CodeSnapshotUnavailable = "snapshot.unavailable"

	// Sandbox lifetime and agent.
	CodeAgentNotReady    = "sandbox.agent_not_ready"
	CodeAgentUnreachable = "sandbox.agent_unreachable"
	CodeSandboxDied      = "sandbox.died"
	CodeOOM              = "sandbox.oom"
	CodeSandboxEvicted   = "sandbox.evicted"
	CodePidsLimit        = "sandbox.pids_limit"
	CodeExecTimeout      = "sandbox.exec_timeout"
	CodeWaitTimeout      = "sandbox.wait_timeout"
	CodeSpawnFailed      = "sandbox.spawn_failed"
	CodeSandboxGone      = "sandbox.gone"

	// Files and patches inside a sandbox.
	CodeFileNotFound  = "file.not_found"
	CodePathNotFound  = "file.path_not_found"
	CodeIsDirectory   = "file.is_directory"
	CodeNotDirectory  = "file.not_directory"
	CodePathEscape    = "file.path_escape"
	CodeInvalidBase64 = "file.invalid_base64"
	CodeFileIO        = "file.io"
	CodeGitMissing    = "patch.git_missing"

	// Runtime and images.
	CodeCreateFailed     = "runtime.create_failed"
	CodeCapacity         = "runtime.capacity"
	CodeImageRef         = "image.invalid_reference"
	CodeImagePull        = "image.pull_failed"
	CodeImageNotFound    = "image.not_found"
	CodeImageUnpack      = "image.unpack_failed"
	CodeKindUnsupported  = "runtime.kind_unsupported"
	CodeNetworkEgressOff = "runtime.egress_unavailable"
	// CodeKubeAPI: the Kubernetes API server refused or did not answer a
	// call of the kube runtime (after its retries).
	CodeKubeAPI = "runtime.kube_api"

	// Platform.
	CodeInternal         = "platform.internal"
	CodeTimeout          = "platform.timeout"
	CodeMisconfigured    = "platform.misconfigured"
	CodeStoreUnavailable = "platform.store_unavailable"
	CodeShuttingDown     = "platform.shutting_down"
	// CodeSandboxElsewhere: the replica asked cannot reach the sandbox's
	// container (another host or state directory).
	CodeSandboxElsewhere = "platform.sandbox_elsewhere"
)

// Files inside a sandbox, continued.
const (
	CodeFilePermission = "file.permission_denied"
	CodeNotRegular     = "file.not_regular"
	CodeSymlinkLoop    = "file.symlink_loop"
	// CodeReadOnly: the path is on a read-only mount (the agent's own
	// binary, /proc/sys, /sys): nothing can be written there.
	CodeReadOnly = "file.read_only"
)

// Uploads.
const (
	// CodeUploadsBusy: the server is receiving as many large uploads as
	// it allows at once, and the request waited too long for a turn.
	CodeUploadsBusy = "platform.uploads_busy"
)

// Local images (oci-layout:, docker-archive:).
const (
	// CodeImagePathNotAllowed: the path lies outside the directories the
	// server reads local images from.
	CodeImagePathNotAllowed = "image.path_not_allowed"
	// CodeImagePathNotRegular: the path is not a regular file
	// (docker-archive:) or a directory of regular files (oci-layout:).
	CodeImagePathNotRegular = "image.path_not_regular"
)

// Client side of the API.
const (
	// CodeUnreachable: the server could not be reached or the connection
	// broke before a response arrived (dial error, reset, EOF).
	CodeUnreachable = "platform.unreachable"
	// CodeBadResponse: the server answered with a body the client cannot
	// decode (not JSON, or not the expected shape).
	CodeBadResponse = "platform.bad_response"
	// CodeResponseTooLarge: a response exceeded the client's size bound.
	CodeResponseTooLarge = "client.response_too_large"
	// CodePTYFailed: an interactive PTY session ended with an error frame.
	CodePTYFailed = "sandbox.pty_failed"
)

// Coordination across server replicas.
const (
	// CodeLockLost: a lock's lease expired or another holder took it, so a
	// write conditioned on it was refused.
	CodeLockLost = "platform.lock_lost"
)

// Browser sessions: the browser process, its tabs and the protocol.
const (
	// CodeBrowserCrashed: the browser process died or its connection broke.
	CodeBrowserCrashed = "browser.crashed"
	// CodeBrowserTabCrashed: the renderer of a tab crashed; navigating revives it.
	CodeBrowserTabCrashed = "browser.tab_crashed"
	// CodeBrowserTimeout: the browser did not answer a command in time (a hung
	// renderer, a busy machine).
	CodeBrowserTimeout = "browser.timeout"
	// CodeBrowserProtocol: the browser answered a command with an error that
	// no better class fits.
	CodeBrowserProtocol = "browser.protocol_error"
	// CodeBrowserLaunch: the browser could not be started.
	CodeBrowserLaunch = "browser.launch_failed"
	// CodeBrowserClosed: the session was closed by its owner.
	CodeBrowserClosed = "browser.closed"
	// CodeBrowserStateTooLarge: a browser's saved state (cookies, storage,
	// tabs) exceeds the size a snapshot carries.
	CodeBrowserStateTooLarge = "browser.state_too_large"
)

// Actions an agent asks a browser or desktop to run.
const (
	CodeActionInvalid       = "action.invalid"
	CodeActionNoSuchElement = "action.no_such_element"
	// CodeActionStaleElement: the element id comes from an older page.
	CodeActionStaleElement = "action.stale_element"
	// CodeActionStaleFrame: a strict action named an observation frame that
	// is no longer the latest one.
	CodeActionStaleFrame  = "action.stale_frame"
	CodeActionNoSuchTab   = "action.no_such_tab"
	CodeActionNoSuchOpt   = "action.no_such_option"
	CodeActionNoDialog    = "action.no_dialog"
	CodeActionDialogOpen  = "action.dialog_open"
	CodeActionNotEditable = "action.not_editable"
)

// Navigations and the sites they reach. A main-document HTTP error status
// is CodeSiteHTTPPrefix followed by the status ("site.http_503").
const (
	CodeSiteHTTPPrefix        = "site.http_"
	CodeSiteDNS               = "site.dns"
	CodeSiteConnectionRefused = "site.connection_refused"
	CodeSiteConnectionReset   = "site.connection_reset"
	CodeSiteConnectionClosed  = "site.connection_closed"
	CodeSiteTLS               = "site.tls"
	CodeSiteTimeout           = "site.timeout"
	CodeSiteUnreachable       = "site.unreachable"
	CodeNetworkOffline        = "network.offline"
	CodeNetworkProxy          = "network.proxy"
	CodeNavigationFailed      = "navigation.failed"
	CodeNavigationAborted     = "navigation.aborted"
	CodeNavigationBlocked     = "navigation.blocked"
	CodeNavigationTimeout     = "navigation.timeout"
	CodeNavigationInvalidURL  = "navigation.invalid_url"
	CodeNavigationNoHistory   = "navigation.no_history"
)

// Jobs.
const (
	// CodeJobLost: the server process running a job stopped before the job
	// finished (a replica died); the command's outcome is unknown.
	CodeJobLost = "platform.job_lost"
)

// Egress: the per-sandbox proxy and the dialer behind it.
const (
	// CodeNetworkDNS: the resolver itself failed (timeout, SERVFAIL, no
	// server reachable) — the network's fault, unlike CodeSiteDNS, where
	// the resolver answered that the name does not exist.
	CodeNetworkDNS = "network.dns"
	// CodeEgressDenied: the host is not on the sandbox's egress allow-list.
	CodeEgressDenied = "policy.egress_denied"
	// CodeEgressPrivate: the host resolves to a loopback, link-local or
	// private address, which sandboxes may not reach.
	CodeEgressPrivate = "policy.egress_private"
	// CodeEgressUnavailable: the sandbox's egress tunnel to the server is
	// down (the server restarted, or is re-attaching).
	CodeEgressUnavailable = "network.egress_unavailable"
	// CodeSiteBlocked: the site answered with a bot wall or a CAPTCHA.
	CodeSiteBlocked = "site.blocked"
	// CodeSiteUnavailable: the site's circuit breaker is open after
	// repeated failures; the request failed fast without reaching it.
	CodeSiteUnavailable = "site.unavailable"
	// CodeSiteRateLimited: the server's per-host rate limit held the
	// request back longer than its deadline allows.
	CodeSiteRateLimited = "site.rate_limited"
)

// Injected faults and the runtime's limits.
const (
	// CodeAgentDied: the sandbox's agent process died.
	CodeAgentDied = "sandbox.agent_died"
	// CodeExecKilled: the command was killed by a signal it did not send itself.
	CodeExecKilled = "sandbox.exec_killed"
	// CodeBrowserHung: the browser stopped answering and was restarted.
	CodeBrowserHung = "browser.hung"
	// CodeDesktopXDied: the X server of a desktop sandbox died.
	CodeDesktopXDied = "desktop.x_server_died"
	// CodeDesktopWMDied: the window manager of a desktop sandbox died.
	CodeDesktopWMDied = "desktop.wm_died"
	// CodeDesktopLaunch: the desktop (X server, window manager, apps)
	// could not be started.
	CodeDesktopLaunch = "desktop.launch_failed"
	// CodeFaultPlanInvalid: a fault plan names an unknown kind or field.
	CodeFaultPlanInvalid = "client.invalid_fault_plan"
)

// Limits a request may not exceed.
const (
	// CodeLimitExceeded: a well-formed request field asks for more than
	// this server gives (cpu or memory above the host's or the configured
	// maximum); a server with more room may take the same request.
	CodeLimitExceeded = "client.limit_exceeded"
)

// Episodes and their evaluation.
const (
	// CodeJudgeFailed: the LLM judge could not be reached or gave no
	// usable verdict; the episode ends env_error, never failure.
	CodeJudgeFailed = "platform.judge_failed"
	// CodeTaskNotFound: no loaded task has the id.
	CodeTaskNotFound = "task.not_found"
	// CodeTaskInvalid: a task file or task is malformed.
	CodeTaskInvalid = "task.invalid"
	// CodeTaskSetupFailed: a task's setup (files, commands) failed.
	CodeTaskSetupFailed = "task.setup_failed"
	// CodeEpisodeNotFound: no episode has the id.
	CodeEpisodeNotFound = "episode.not_found"
	// CodeEpisodeDone: the episode has ended; it takes no more steps.
	CodeEpisodeDone = "episode.done"
	// CodeEpisodeDeadline: the episode ran past its deadline or step limit.
	CodeEpisodeDeadline = "episode.deadline"
	// CodeRecordingNotFound: no recording (or no such step of one) has the id.
	CodeRecordingNotFound = "recording.not_found"
)

// Service endpoints: a port inside a sandbox exposed at a URL of the server
// (POST /sandboxes/{id}/services, traffic through /s/{token}/...).
const (
	// CodeServicePortInvalid: the port is out of range or reserved (the
	// agent's own port, the egress proxy's).
	CodeServicePortInvalid = "service.port_invalid"
	// CodeServiceNotExposed: the sandbox does not expose that port.
	CodeServiceNotExposed = "service.not_exposed"
	// CodeServiceTokenInvalid: a service URL's token is unknown, expired or
	// revoked, or names a sandbox that is gone.
	CodeServiceTokenInvalid = "service.token_invalid"
	// CodeServiceUnreachable: nothing accepts connections on the port
	// inside the sandbox, or the connection to it broke.
	CodeServiceUnreachable = "service.unreachable"
	// CodeServiceNotReady: with wait_ready, the service did not answer its
	// health path with a 2xx within ready_timeout.
	CodeServiceNotReady = "service.not_ready"
	// CodeServiceTimeout: the service did not answer a proxied request in time.
	CodeServiceTimeout = "service.timeout"
)

// Policies the batch runner drives: the agent under test, not the
// environment, so none of these ends an episode env_error.
const (
	// CodePolicyEndpointFailed: a policy served at a URL could not be
	// reached, timed out or answered 5xx after its retries.
	CodePolicyEndpointFailed = "policy.endpoint_failed"
	// CodePolicyBadResponse: a policy endpoint answered, but not with an
	// action (a 4xx, a body that is not JSON, no "action" object).
	CodePolicyBadResponse = "policy.bad_response"
	// CodePolicyNoScript: the scripted policy has no script for the task.
	CodePolicyNoScript = "policy.no_script"
	// CodePolicyFailed: a policy returned an error it did not classify.
	CodePolicyFailed = "policy.failed"
)
