package main

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/orchard/orchard/server"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/sitehealth"
)

// Config is everything `orchard serve` reads: flags, then Orchard's
// environment names where they exist (ORCHARD_COMPAT §8), then ours.
type Config struct {
	Addr        string // --addr / ORCHARD_ADDR (HOST and PORT also honoured)
	StateDir    string // --state-dir / ORCHARD_STATE_DIR
	Store       string // --store / ORCHARD_STORE: memory | redis (USE_REDIS=true also selects redis)
	RedisURL    string // REDIS_URL: redis://[user:pass@]host:port[/db], rediss:// for TLS
	RedisPrefix string // REDIS_PREFIX / ORCHARD_REDIS_PREFIX: key prefix, so several servers can share one Redis
	RedisCACert string // REDIS_CA_CERT: PEM file of CAs trusted for rediss:// besides the system roots
	AgentPath   string // ORCHARD_AGENT: the agent binary when not embedded
	InitPath    string // ORCHARD_INIT: orchard-init when not beside this binary
	LogLevel    string // LOG_LEVEL
	LogFormat   string // LOG_FORMAT: json | text
	// EgressAllowPrivate lists private ranges (CIDR or address, comma
	// separated) that network-enabled sandboxes may reach
	// (EGRESS_ALLOW_PRIVATE); by default they reach public addresses only.
	EgressAllowPrivate string
	// EgressHosts pins host names to addresses for sandbox egress
	// (EGRESS_HOSTS="site.test=10.0.0.5,..."), like curl --resolve.
	EgressHosts string
	// HostExpose lists host paths that "host" sandboxes see read-only
	// although a mask hides them (--host-expose, repeated, or
	// ORCHARD_HOST_EXPOSE, separated by ':'); see local.Config.HostExpose.
	HostExpose []string
	// ImageDirs lists the directories "docker-archive:" and "oci-layout:"
	// image references may name (--image-dir, repeated, or
	// ORCHARD_IMAGE_DIRS, separated by ':'); none by default.
	ImageDirs []string
	// Harnesses are installed into the harness store (STATE_DIR/harnesses)
	// at start, at the lock file's versions (--harnesses, repeated, or
	// ORCHARD_HARNESSES, comma-separated; "all": every known one).
	Harnesses []string
	// ShutdownTimeout bounds graceful shutdown: in-flight requests and
	// running jobs get this long before they are cut.
	ShutdownTimeout time.Duration

	// Runtime is where sandboxes run (--runtime / ORCHARD_RUNTIME): local
	// (containers on this machine) or kube (pods, settings in Kube).
	Runtime string
	Kube    KubeConfig

	Server     server.Config
	Manager    manager.Config
	SiteHealth sitehealth.Config // SITE_BREAKER_FAILURES, SITE_BREAKER_OPEN_SECONDS, SITE_RATE_PER_SECOND, SITE_RATE_BURST
}

var keySplit = regexp.MustCompile(`[,\s]+`)

func parseBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("not a boolean: %q", s)
}

func defaultStateDir(getenv func(string) string) string {
	if os.Geteuid() == 0 {
		return "/var/lib/orchard"
	}
	if d := getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "orchard")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "state", "orchard")
}

// loadEnv fills cfg from the environment; flags already set win.
func loadEnv(cfg *Config, getenv func(string) string, flagSet func(string) bool) error {
	var errs []string
	str := func(name string, dst *string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	num := func(name string, set func(float64)) {
		if v := getenv(name); v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 {
				errs = append(errs, fmt.Sprintf("%s: not a non-negative number: %q", name, v))
				return
			}
			set(f)
		}
	}
	boolean := func(name string, dst *bool) {
		if v := getenv(name); v != "" {
			b, err := parseBool(v)
			if err != nil {
				errs = append(errs, name+": "+err.Error())
				return
			}
			*dst = b
		}
	}
	// paths reads a list of paths separated by ':', as PATH is.
	paths := func(name string, dst *[]string) {
		for _, p := range filepath.SplitList(getenv(name)) {
			if p != "" {
				*dst = append(*dst, p)
			}
		}
	}
	secs := func(name string, dst *time.Duration, unit time.Duration) {
		num(name, func(f float64) { *dst = time.Duration(f * float64(unit)) })
	}

	if !flagSet("addr") {
		str("ORCHARD_ADDR", &cfg.Addr)
		if h, p := getenv("HOST"), getenv("PORT"); p != "" {
			if h == "" {
				h = "127.0.0.1"
			}
			cfg.Addr = h + ":" + p
		}
	}
	if !flagSet("state-dir") {
		str("ORCHARD_STATE_DIR", &cfg.StateDir)
	}
	if !flagSet("store") {
		str("ORCHARD_STORE", &cfg.Store)
		if v := getenv("USE_REDIS"); v != "" {
			if b, err := parseBool(v); err == nil && b {
				cfg.Store = "redis"
			}
		}
	}
	if !flagSet("harnesses") {
		if v := getenv("ORCHARD_HARNESSES"); v != "" {
			cfg.Harnesses = strings.Split(v, ",")
		}
	}
	if !flagSet("default-harnesses") {
		if v := getenv("DEFAULT_HARNESSES"); v != "" {
			cfg.Manager.DefaultHarnesses = strings.Split(v, ",")
		}
	}
	if !flagSet("host-expose") {
		paths("ORCHARD_HOST_EXPOSE", &cfg.HostExpose)
	}
	if !flagSet("image-dir") {
		paths("ORCHARD_IMAGE_DIRS", &cfg.ImageDirs)
	}
	if !flagSet("runtime") {
		str("ORCHARD_RUNTIME", &cfg.Runtime)
	}
	cfg.Kube.loadEnv(str, flagSet)
	str("ORCHARD_AGENT", &cfg.AgentPath)
	str("ORCHARD_INIT", &cfg.InitPath)
	str("REDIS_URL", &cfg.RedisURL)
	str("REDIS_PREFIX", &cfg.RedisPrefix)
	str("ORCHARD_REDIS_PREFIX", &cfg.RedisPrefix)
	str("REDIS_CA_CERT", &cfg.RedisCACert)
	if p := getenv("REDIS_PASSWORD"); p != "" && cfg.RedisURL != "" && !strings.Contains(cfg.RedisURL, "@") {
		// Orchard deployments pass the password apart from the URL.
		scheme, rest, _ := strings.Cut(cfg.RedisURL, "://")
		cfg.RedisURL = scheme + "://:" + url.QueryEscape(p) + "@" + rest
	}
	str("EGRESS_ALLOW_PRIVATE", &cfg.EgressAllowPrivate)
	str("EGRESS_HOSTS", &cfg.EgressHosts)
	num("SITE_BREAKER_FAILURES", func(f float64) { cfg.SiteHealth.FailureThreshold = int(f) })
	secs("SITE_BREAKER_OPEN_SECONDS", &cfg.SiteHealth.OpenFor, time.Second)
	num("SITE_RATE_PER_SECOND", func(f float64) { cfg.SiteHealth.RatePerSecond = f })
	num("SITE_RATE_BURST", func(f float64) { cfg.SiteHealth.Burst = int(f) })
	str("LOG_LEVEL", &cfg.LogLevel)
	str("LOG_FORMAT", &cfg.LogFormat)

	str("SERVICE_NAME", &cfg.Server.ServiceName)
	str("SERVICE_PUBLIC_BASE_URL", &cfg.Server.ServicePublicURL)
	paths("TASK_REPO_ROOTS", &cfg.Server.RepoRoots)
	if v := getenv("API_KEYS"); v != "" {
		for _, k := range keySplit.Split(v, -1) {
			if k != "" {
				cfg.Server.APIKeys = append(cfg.Server.APIKeys, k)
			}
		}
	}
	boolean("REQUIRE_API_KEY", &cfg.Server.RequireAPIKey)
	num("ORCHARD_MAX_BODY_BYTES", func(f float64) { cfg.Server.MaxBodyBytes = int64(f) })
	num("ORCHARD_MAX_CONCURRENT_UPLOADS", func(f float64) { cfg.Server.MaxConcurrentUploads = int(f) })

	m := &cfg.Manager
	str("SANDBOX_NAMESPACE", &m.Namespace)
	str("DEFAULT_CPU", &m.DefaultCPU)
	str("DEFAULT_MEMORY", &m.DefaultMemory)
	if !flagSet("default-ephemeral-storage") {
		str("DEFAULT_EPHEMERAL_STORAGE", &m.DefaultEphemeralStorage)
	}
	str("DEFAULT_WORKING_DIR", &m.WorkingDir)
	str("ORCHARD_DEFAULT_IMAGE", &m.DefaultImage)
	num("DEFAULT_TIMEOUT_SECONDS", func(f float64) { m.DefaultTimeoutSeconds = int(f) })
	num("MAX_CONCURRENT_CREATES", func(f float64) { m.MaxConcurrentCreates = int(f) })
	num("ORCHARD_MAX_OUTPUT_BYTES", func(f float64) { m.MaxOutputBytes = int64(f) })
	quantity := func(name string, parse func(string) error) {
		if v := getenv(name); v != "" {
			if err := parse(v); err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", name, err))
			}
		}
	}
	quantity("ORCHARD_MAX_CPU", func(v string) (err error) { m.MaxCPU, err = manager.ParseCPU(v); return err })
	quantity("ORCHARD_MAX_MEMORY", func(v string) (err error) { m.MaxMemory, err = manager.ParseMemory(v); return err })
	quantity("ORCHARD_SNAPSHOT_MAX_BYTES", func(v string) (err error) {
		m.SnapshotMaxBytes, err = manager.ParseEphemeralStorage(v)
		return err
	})
	num("ORCHARD_FORK_MAX", func(f float64) { m.ForkMax = int(f) })
	secs("SANDBOX_TTL_HOURS", &m.SandboxTTL, time.Hour)
	secs("ORPHAN_JOB_TTL_HOURS", &m.OrphanJobTTL, time.Hour)
	secs("CLEANUP_INTERVAL_SECONDS", &m.CleanupInterval, time.Second)
	secs("PENDING_TIMEOUT_BUFFER_SECONDS", &m.PendingTimeoutBuffer, time.Second)
	secs("HEARTBEAT_TIMEOUT_SECONDS", &m.HeartbeatTimeout, time.Second)
	secs("AGENT_READY_WAIT_SECONDS", &m.AgentReadyWait, time.Second)
	secs("EXEC_CONNECT_RETRY_WINDOW", &m.ExecConnectRetryWindow, time.Second)
	boolean("HEARTBEAT_CLEANUP_ENABLED", &m.HeartbeatCleanupEnabled)
	secs("ORCHARD_SHUTDOWN_TIMEOUT_SECONDS", &cfg.ShutdownTimeout, time.Second)

	if len(errs) > 0 {
		return fmt.Errorf("configuration: %s", strings.Join(errs, "; "))
	}
	return nil
}

func defaultConfig(getenv func(string) string) Config {
	return Config{
		Addr:            "127.0.0.1:8000",
		StateDir:        defaultStateDir(getenv),
		Store:           "memory",
		LogLevel:        "INFO",
		LogFormat:       "text",
		ShutdownTimeout: 10 * time.Second,
		Server:          server.Config{RequireAPIKey: true},
		Manager:         manager.Config{HeartbeatCleanupEnabled: true, DefaultEphemeralStorage: "10Gi"},
	}
}

// validate checks what the server cannot run without.
func (c *Config) validate() error {
	switch c.Runtime {
	case "", "local":
	case "kube":
		if c.Kube.AgentImage == "" {
			return fmt.Errorf("runtime kube needs the agent image (--kube-agent-image or ORCHARD_KUBE_AGENT_IMAGE)")
		}
	default:
		return fmt.Errorf("unknown runtime %q (local or kube)", c.Runtime)
	}
	switch c.Store {
	case "memory":
	case "redis":
		if c.RedisURL == "" {
			return fmt.Errorf("store redis needs REDIS_URL (redis://host:6379/0)")
		}
	default:
		return fmt.Errorf("unknown store %q (memory or redis)", c.Store)
	}
	if c.StateDir == "" {
		return fmt.Errorf("state directory is empty")
	}
	if _, err := manager.ParseEphemeralStorage(c.Manager.DefaultEphemeralStorage); err != nil {
		return fmt.Errorf("default ephemeral storage (DEFAULT_EPHEMERAL_STORAGE): %w", err)
	}
	for _, k := range c.Server.APIKeys {
		if strings.ContainsAny(k, "?&#% ") {
			return fmt.Errorf("API key contains characters that do not survive a URL query; use [A-Za-z0-9_-]")
		}
	}
	return nil
}
