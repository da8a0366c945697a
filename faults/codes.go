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
	CodeSandboxExists   = "sandbox.exists"
	CodeSandboxNotReady = "sandbox.not_ready"

	// Sandbox lifetime and agent.
	CodeAgentNotReady    = "sandbox.agent_not_ready"
	CodeAgentUnreachable = "sandbox.agent_unreachable"
	CodeSandboxDied      = "sandbox.died"
	CodeOOM              = "sandbox.oom"
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

	// Platform.
	CodeInternal         = "platform.internal"
	CodeTimeout          = "platform.timeout"
	CodeMisconfigured    = "platform.misconfigured"
	CodeStoreUnavailable = "platform.store_unavailable"
	CodeShuttingDown     = "platform.shutting_down"
)

// Files inside a sandbox, continued.
const (
	CodeFilePermission = "file.permission_denied"
	CodeNotRegular     = "file.not_regular"
	CodeSymlinkLoop    = "file.symlink_loop"
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
