#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine:
#   scripts/dev.sh serve [flags]   install what is missing, build, run the server
#   scripts/dev.sh test            install what is missing, build, run every test
#   scripts/dev.sh build           build bin/orchard and bin/orchard-agent only
# Installing needs root; without it the script names the exact command to run.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: git (apply_patch inside host-image sandboxes, go modules),
# gcc and libc headers (the server links runc's libcontainer with cgo),
# iproute2 (tests check a sandbox sees only loopback), busybox-static
# (tests build small OCI images), procps (leak check), libseccomp-dev
# (the server is built with -tags seccomp so libcontainer filters syscalls),
# redis-server (the Redis store's tests start their own on a free port),
# chromium (desktop sandboxes show it; headed browser sandboxes run it),
# chromium-headless-shell (what headless browser sandboxes run: the same
# engine without the browser's UI, ≈40 % less memory per sandbox)
# and fonts-dejavu-core (a font for the pages it renders in screenshots);
# nodejs runs Playwright against the DevTools proxy in the server's tests,
# installed with npm (Debian's npm package where Node.js came without it),
# which honours a configured registry or mirror;
# python3 runs the Python client's suite (sdk/python) against a server;
# e2fsprogs (mkfs.ext4) formats the filesystems that hold sandboxes'
# writable layers on disk; shellcheck checks the deploy scripts;
# libjpeg-turbo-progs (djpeg) decodes the desktop's JPEG encoder's output
# as a second, strict decoder;
# python3-pip installs pip harnesses (the harness store's tests install one
# from a wheel the test builds, without an index); python3-venv makes the
# fresh virtual environment the Python package is installed into, offline.
PACKAGES=(git gcc python3 python3-pip python3-venv libc6-dev libseccomp-dev iproute2 nftables busybox-static procps ca-certificates curl redis-server chromium chromium-headless-shell fonts-dejavu-core xvfb openbox xterm x11-utils x11-xserver-utils x11vnc xclip ffmpeg libjpeg-turbo-progs nodejs e2fsprogs shellcheck)

need_go() {
  if command -v go >/dev/null 2>&1; then return; fi
  if [ -x /usr/local/go/bin/go ]; then export PATH=/usr/local/go/bin:$PATH; return; fi
  echo "Go 1.26 is required: install it from https://go.dev/dl/ into /usr/local/go" >&2
  exit 1
}

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # A Node.js of another origin (NodeSource) brings its own npm.
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" -ne 0 ]; then
    echo "Missing packages: ${missing[*]}" >&2
    echo "Install them with: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "Installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# npm installs the coding-agent harnesses of the harness store's tests
# from the npm registry (into ~/.cache/orchard, once per machine). A
# Node.js from NodeSource carries its own npm, which Debian's npm package
# would conflict with: Debian's is installed only when there is none.
# Debian 12's node (18) is older than pi needs (20.6): the store then
# fetches Node.js 20 from the npm registry itself (harness/store.go).
need_npm() {
  command -v npm >/dev/null 2>&1 && return
  if [ "$(id -u)" -ne 0 ]; then
    echo "npm is missing: install it with: sudo apt-get install -y npm" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
}

build() {
  need_go
  mkdir -p bin
  local ver
  ver=$(git describe --always --dirty 2>/dev/null || echo dev)
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/orchard-agent ./cmd/orchard-agent
  cp bin/orchard-agent agentbin/orchard-agent
  go build -trimpath -tags embedagent,seccomp -ldflags "-X main.version=$ver" -o bin/orchard ./cmd/orchard
  # The containers' init; bin/orchard finds it beside itself. Same tags as
  # the server: both halves of libcontainer's start-up must agree.
  go build -trimpath -tags seccomp -ldflags "-s -w" -o bin/orchard-init ./cmd/orchard-init
}

# The Playwright client of the DevTools proxy test, installed by npm from
# whatever registry npm is configured with.
fetch_playwright() {
  local dir=server/testdata/playwright
  local ver
  ver=$(sed -n 's/.*"playwright-core": "\(.*\)".*/\1/p' "$dir/package.json")
  if [ -f "$dir/node_modules/playwright-core/package.json" ] &&
    grep -q "\"version\": \"$ver\"" "$dir/node_modules/playwright-core/package.json"; then
    return
  fi
  (cd "$dir" && npm install --no-audit --no-fund --no-package-lock --loglevel=error >/dev/null)
}

# start_kube starts the local Kubernetes the kube runtime's tests use
# (scripts/kube.sh: built once from the Go module proxy into a cache,
# then up in seconds) and hands it to them; it is stopped after the run.
# ORCHARD_KUBE_NODE=1 adds a real node (containerd, kubelet).
start_kube() {
  local out
  out=$(scripts/kube.sh up ${ORCHARD_KUBE_NODE:+--node})
  trap 'scripts/kube.sh down >/dev/null' EXIT
  while IFS='=' read -r k v; do
    case $k in
    KUBECONFIG) export ORCHARD_TEST_KUBECONFIG="$v" ;;
    ORCHARD_KUBE_SHELL_IMAGE) export ORCHARD_TEST_KUBE_SHELL_IMAGE="$v" ;;
    ORCHARD_KUBE_AGENT_IMAGE) export ORCHARD_TEST_KUBE_AGENT_IMAGE="$v" ;;
    esac
  done <<<"$out"
}

cmd=${1:-}
shift || true
case "$cmd" in
  build)
    build ;;
  serve)
    install_packages
    build
    if [ "$(id -u)" -ne 0 ]; then
      echo "orchard serve creates containers (namespaces, cgroups, overlays) and needs root: run with sudo" >&2
      exit 1
    fi
    exec bin/orchard serve "$@" ;;
  demo)
    install_packages
    build
    if [ "$(id -u)" -ne 0 ]; then
      echo "orchard demo creates containers (namespaces, cgroups, overlays) and needs root: run with sudo" >&2
      exit 1
    fi
    exec bin/orchard demo "$@" ;;
  test)
    install_packages
    need_npm
    build
    fetch_playwright
    # The chart's tests render it with helm, built once from the Go
    # module proxy into ~/.cache/orchard/helm (a few minutes the first time).
    deploy/helm.sh >/dev/null
    # The image builder's tests resolve Debian packages through the host's
    # apt lists and download them: lists that are missing, or old enough
    # that the mirror dropped their versions, would fail them.
    if [ "$(id -u)" = 0 ]; then apt-get update -qq; fi
    export ORCHARD_AGENT="$PWD/bin/orchard-agent"
    # The leak check looks only at state dirs made after this mark, so a
    # run killed earlier on this machine cannot fail this one.
    ORCHARD_LEAK_MARK=$(mktemp /tmp/orchard-leakmark.XXXXXX)
    export ORCHARD_LEAK_MARK
    go vet -tags seccomp ./...
    unformatted=$(gofmt -l . | grep -v '^agentbin/' || true)
    if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted" >&2; exit 1; fi
    # Everything but the kube runtime's tests first, without a cluster
    # running beside them: its pods' churn would load the machine the
    # timing-sensitive tests (chaos attribution, desktop input) run on.
    # The longest packages go first: go test starts packages in the order
    # given, two at a time on two cores, and the server's (17 minutes
    # under -race) started among the last would run on alone.
    slow=$(go list ./server ./deploy/images ./cmd/orchard ./browser ./runtime/local)
    mapfile -t pkgs < <(echo "$slow"; go list ./... | grep -v '/runtime/kube$' | grep -vxF "$slow")
    go test -race -count=1 -timeout 25m -tags seccomp -skip 'OnKube' "$@" "${pkgs[@]}"
    echo "dev.sh: tests without a cluster done at ${SECONDS}s" >&2
    start_kube
    # The kube runtime's tests and the commands' run on the cluster at
    # once: each test has namespaces of its own, and the nodes one test
    # writes by hand are tainted against the others' pods.
    kube_log=$(mktemp /tmp/orchard-test-kube.XXXXXX)
    go test -race -count=1 -timeout 15m -tags seccomp "$@" ./runtime/kube >"$kube_log" 2>&1 &
    kube_pid=$!
    rc=0
    go test -race -count=1 -timeout 15m -tags seccomp -run 'OnKube' "$@" ./cmd/orchard ./deploy || rc=$?
    wait "$kube_pid" || rc=$?
    cat "$kube_log"; rm -f "$kube_log"
    if [ "$rc" -ne 0 ]; then exit "$rc"; fi
    echo "dev.sh: tests done at ${SECONDS}s" >&2
    scripts/kube.sh down >/dev/null; trap - EXIT
    rc=0; scripts/leakcheck.sh || rc=$?
    rm -f "$ORCHARD_LEAK_MARK"
    exit $rc ;;
  *)
    echo "usage: scripts/dev.sh serve|demo|test|build" >&2
    exit 2 ;;
esac
