#!/usr/bin/env bash
# A local Kubernetes for the kube runtime's tests, built from the Go module
# proxy (no Docker, no release downloads). See docs/kubernetes.md.
#   scripts/kube.sh build [--all]   build the binaries into the cache, once
#   scripts/kube.sh up [--node]     start etcd, kube-apiserver, kube-scheduler, kwok
#                                   (--node: also containerd, kubelet, controller-manager)
#   scripts/kube.sh down            stop everything and clean the host state
#   scripts/kube.sh env             print KUBECONFIG=... of the running cluster
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

KUBE_VERSION=v1.37.2
# The staging modules (k8s.io/api, client-go, ...) are published as v0.X.Y
# for Kubernetes v1.X.Y.
STAGING_VERSION=v0.37.2
KWOK_VERSION=v0.8.0
# A cold build took 47 min on 2 cores shared with other builds (34
# CPU-minutes); the limit leaves room for a busier machine.
BUILD_TIMEOUT=${ORCHARD_KUBE_BUILD_TIMEOUT:-5400}
CACHE=${ORCHARD_KUBE_CACHE:-$HOME/.cache/orchard/kube/$KUBE_VERSION}
BIN=$CACHE/bin
STATE=${ORCHARD_KUBE_DIR:-/tmp/orchard-kube}

# Unusual ports (all on loopback but the kubelet's), so a cluster started
# here does not collide with another etcd or Kubernetes on the machine.
# ORCHARD_KUBE_PORT_OFFSET moves them all, so a second control plane (with
# its own ORCHARD_KUBE_DIR) can run beside the first; a real node is one
# per machine whatever the offset.
OFF=${ORCHARD_KUBE_PORT_OFFSET:-0}
case $OFF in '' | *[!0-9]*) echo "kube.sh: ORCHARD_KUBE_PORT_OFFSET must be a number" >&2; exit 2 ;; esac
ETCD_CLIENT_PORT=$((23790 + OFF))
ETCD_PEER_PORT=$((23800 + OFF))
APISERVER_PORT=$((26443 + OFF))
SCHEDULER_PORT=$((26459 + OFF))
CONTROLLER_MANAGER_PORT=$((26457 + OFF))
KWOK_PORT=$((26480 + OFF))
KUBELET_PORT=$((26250 + OFF))
KUBELET_HEALTHZ_PORT=$((26248 + OFF))

SERVICE_CIDR=10.96.0.0/16
KWOK_CIDR=10.250.0.0/16
POD_CIDR=10.244.0.0/24
KWOK_NODE=kwok-node-0

AGENT_IMAGE=orchard.local/agent:dev
SHELL_IMAGE=orchard.local/shell:dev
PAUSE_IMAGE=orchard.local/pause:dev

# The binaries `up` needs (kubectl creates the fake node and waits for it);
# the kubelet and kube-controller-manager matter only for a real node, and
# building them costs another 5 to 8 CPU-minutes.
CORE_BINARIES=(kube-apiserver kube-scheduler kubectl kwok)
NODE_BINARIES=(kube-controller-manager kubelet)

log() { echo "kube.sh: $*" >&2; }
die() { echo "kube.sh: $*" >&2; exit 1; }

need_go() {
  if command -v go >/dev/null 2>&1; then return; fi
  if [ -x /usr/local/go/bin/go ]; then export PATH=/usr/local/go/bin:$PATH; return; fi
  die "Go 1.26 is required to build Kubernetes: install it from https://go.dev/dl/ into /usr/local/go"
}

# ---------------------------------------------------------------- build

# ldflags stamp the version the binaries report: without them the API
# server says v0.0.0-master+$Format:%H$ and kubectl cannot parse it.
kube_ldflags() {
  local major=${KUBE_VERSION#v} minor
  minor=${major#*.}; minor=${minor%%.*}; major=${major%%.*}
  local flags="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    flags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

# module_file prints where the Go module proxy's copy of a module lands;
# what = GoMod (its go.mod) or Dir (its unpacked source).
module_file() {
  local mod=$1 what=$2
  (cd / && GOFLAGS= GO111MODULE=on go mod download -json "$mod") |
    sed -n "s/^[[:space:]]*\"$what\": \"\(.*\)\",\{0,1\}$/\1/p"
}

# write_kube_gomod writes a throwaway module that builds k8s.io/kubernetes'
# commands: upstream's require blocks pin every dependency to the version
# upstream tested, and its replace block, which points the staging modules
# at ./staging, points them at their published versions instead.
# sample-cli-plugin and sample-controller are dropped: the proxy refuses
# them (403) and no command needs them.
write_kube_gomod() {
  local dir=$1 upstream
  upstream=$(module_file "k8s.io/kubernetes@$KUBE_VERSION" GoMod)
  [ -f "$upstream" ] || die "build: cannot download k8s.io/kubernetes@$KUBE_VERSION's go.mod from the Go module proxy"
  mkdir -p "$dir"
  {
    echo "module orchard.local/kubebuild"
    echo
    awk -v sv="$STAGING_VERSION" '
      /^(go|godebug) / { print; print ""; next }
      /^(require|replace) \($/ { block = $1; print; next }
      block != "" && /^\)$/ { block = ""; print; print ""; next }
      block != "" && $1 ~ /^k8s\.io\/sample-(cli-plugin|controller)$/ { next }
      block == "replace" && $3 ~ /^\.\/staging\// { print "\t" $1 " => " $1 " " sv; next }
      block != "" { print }
    ' "$upstream"
    echo "require k8s.io/kubernetes $KUBE_VERSION"
  } >"$dir/go.mod.new"
  printf 'package main\n\nfunc main() {}\n' >"$dir/main.go"
  # Keep go.sum across runs: only a changed go.mod starts it over.
  if ! cmp -s "$dir/go.mod.new" "$dir/go.mod.base" 2>/dev/null; then
    cp "$dir/go.mod.new" "$dir/go.mod.base"
    cp "$dir/go.mod.new" "$dir/go.mod"
    rm -f "$dir/go.sum"
  fi
  rm "$dir/go.mod.new"
}

# kwok is built in a second module with the same pins, so it reuses the
# compiled k8s.io packages without moving the Kubernetes build's versions.
write_kwok_gomod() {
  local dir=$1
  write_kube_gomod "$dir"
  grep -q "^require sigs.k8s.io/kwok " "$dir/go.mod" || echo "require sigs.k8s.io/kwok $KWOK_VERSION" >>"$dir/go.mod"
}

# The stamp says with which inputs a binary was built: the versions, the Go
# version, the go build flags and the text of the functions that make the
# modules, the ldflags and kwok's stages. A binary whose stamp matches is
# reused; a change of any input rebuilds.
GO_BUILD_FLAGS=(-mod=mod -trimpath)
RECIPE_HASH=
recipe_hash() {
  if [ -z "$RECIPE_HASH" ]; then RECIPE_HASH=$(recipe_hash_); fi
  echo "$RECIPE_HASH"
}
recipe_hash_() {
  { echo "$KUBE_VERSION $STAGING_VERSION $KWOK_VERSION $(go env GOVERSION) ${GO_BUILD_FLAGS[*]}"
    declare -f kube_ldflags write_kube_gomod write_kwok_gomod kwok_stages
  } | sha256sum | cut -d' ' -f1
}

is_built() {
  local b=$1
  [ -x "$BIN/$b" ] && [ "$(cat "$BIN/.$b.stamp" 2>/dev/null)" = "$(recipe_hash)" ]
}

# build_binaries builds the named binaries that are missing or stale with
# one `go build` per module, so the Go command compiles their shared
# packages once and in parallel.
build_binaries() {
  local want=() kube_pkgs=() b hash
  hash=$(recipe_hash)
  for b in "$@"; do is_built "$b" || want+=("$b"); done
  [ ${#want[@]} -eq 0 ] && return
  need_go
  log "building ${want[*]} into $BIN (cold: 15-50 min on 2 cores; log: $CACHE/build.log)"
  mkdir -p "$BIN" "$CACHE/tmp"
  local out=$CACHE/tmp/bin
  rm -rf "$out"; mkdir -p "$out"
  for b in "${want[@]}"; do
    [ "$b" = kwok ] || kube_pkgs+=("k8s.io/kubernetes/cmd/$b")
  done
  local started=$SECONDS
  if [ ${#kube_pkgs[@]} -gt 0 ]; then
    write_kube_gomod "$CACHE/src/kube"
    # -mod=mod lets go build fill in go.sum from the proxy.
    (cd "$CACHE/src/kube" && nice -n 10 timeout "$BUILD_TIMEOUT" go build "${GO_BUILD_FLAGS[@]}" -ldflags "$(kube_ldflags)" -o "$out/" "${kube_pkgs[@]}") \
      >>"$CACHE/build.log" 2>&1 || { tail -n 30 "$CACHE/build.log" >&2; die "build: go build of ${kube_pkgs[*]} failed (log: $CACHE/build.log)"; }
  fi
  if [[ " ${want[*]} " == *" kwok "* ]]; then
    write_kwok_gomod "$CACHE/src/kwok"
    (cd "$CACHE/src/kwok" && nice -n 10 timeout "$BUILD_TIMEOUT" go build "${GO_BUILD_FLAGS[@]}" -ldflags "-s -w" -o "$out/" "sigs.k8s.io/kwok/cmd/kwok") \
      >>"$CACHE/build.log" 2>&1 || { tail -n 30 "$CACHE/build.log" >&2; die "build: go build of kwok failed (log: $CACHE/build.log)"; }
    kwok_stages >"$out/kwok-stages.yaml"
    mv "$out/kwok-stages.yaml" "$BIN/kwok-stages.yaml"
  fi
  for b in "${want[@]}"; do
    mv "$out/$b" "$BIN/$b"
    echo "$hash" >"$BIN/.$b.stamp"
  done
  log "built ${want[*]} in $((SECONDS - started)) s"
}

# kwok exits with "no stages found" without a config. Its stages ship in
# the module zip: a node becomes Ready and keeps a lease; a pod becomes
# Ready with an IP, completes, and goes away when deleted.
kwok_stages() {
  local dir f first=1
  dir=$(module_file "sigs.k8s.io/kwok@$KWOK_VERSION" Dir)
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    [ -f "$dir/kustomize/stage/$f" ] || die "build: kwok stage $f is missing from sigs.k8s.io/kwok@$KWOK_VERSION"
    [ $first -eq 1 ] || echo "---"
    first=0
    cat "$dir/kustomize/stage/$f"
  done
}

# build [--all]: the binaries `up` needs, or every binary with --all.
build() {
  local b missing=0
  case "${1:-}" in "" | --all) ;; *) die "usage: scripts/kube.sh build [--all]" ;; esac
  need_go
  for b in "${CORE_BINARIES[@]}" ${1:+"${NODE_BINARIES[@]}"}; do is_built "$b" || missing=1; done
  [ $missing -eq 1 ] || return 0
  mkdir -p "$CACHE"
  # One build at a time: a second caller waits for the first and then
  # finds the binaries stamped.
  exec 9>"$CACHE/.lock"
  flock -w 3600 9 || die "build: another build holds $CACHE/.lock for over an hour"
  build_binaries "${CORE_BINARIES[@]}"
  if [ "${1:-}" = --all ]; then build_binaries "${NODE_BINARIES[@]}"; fi
  exec 9>&-
}

# ---------------------------------------------------------------- packages

# etcd-server is the cluster's store, openssl makes its certificates, curl
# asks the components' health endpoints. A real node adds containerd, runc
# and the CNI plugins (bridge, host-local, loopback in /usr/lib/cni);
# busybox-static and bash-static are the shell image's content.
CORE_PACKAGES=(etcd-server openssl curl)
NODE_PACKAGES=(containerd runc containernetworking-plugins busybox-static bash-static)

install_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" -ne 0 ]; then
    echo "Missing packages: ${missing[*]}" >&2
    echo "Install them with: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -qq
  timeout 600 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ---------------------------------------------------------------- processes

# Each component runs detached from this shell (so `up` can return) with
# its pid in $STATE/pids and its output in $STATE/logs.
pidfile() { echo "$STATE/pids/$1.pid"; }
logfile() { echo "$STATE/logs/$1.log"; }

# running NAME: the recorded pid is alive and still the command we started;
# a pid reused by another program is not ours to report or to kill.
running() {
  local f pid cmd want
  f=$(pidfile "$1")
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  want=$(cat "$f.cmd" 2>/dev/null || echo "$1")
  cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
  [[ "$cmd" == *"$want"* ]]
}

# start NAME CMD...: start CMD in its own session, unless already running.
start() {
  local name=$1; shift
  if running "$name"; then return; fi
  mkdir -p "$STATE/pids" "$STATE/logs"
  setsid "$@" </dev/null >"$(logfile "$name")" 2>&1 &
  echo $! >"$(pidfile "$name")"
  # The first argument identifies the process in `running`.
  echo "$1" >"$(pidfile "$name").cmd"
}

# alive PID: the process exists and is not a zombie (the daemons' parent,
# the `up` that started them, is gone, and nothing may reap them at once).
alive() {
  local st
  st=$(sed -n 's/^[0-9]* (.*) \([A-Z]\).*/\1/p' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# stop NAME: SIGTERM, a second SIGTERM after 10 s (kube-apiserver can hang
# in graceful termination on the first), SIGKILL after 20 s.
stop() {
  local name=$1 f pid i
  f=$(pidfile "$name")
  if running "$name"; then
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 200); do
      alive "$pid" || break
      if [ "$i" -eq 100 ]; then kill -TERM "$pid" 2>/dev/null || true; fi
      sleep 0.1
    done
    if alive "$pid"; then
      log "$name did not exit 20 s after SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for i in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
    fi
  fi
  rm -f "$f" "$f.cmd"
}

# fail NAME MESSAGE: say which component failed, show the end of its log.
fail() {
  local name=$1; shift
  echo "kube.sh: $name: $*" >&2
  if [ -f "$(logfile "$name")" ]; then
    echo "--- last lines of $(logfile "$name"):" >&2
    tail -n 25 "$(logfile "$name")" >&2
  fi
  echo "kube.sh: what did start keeps running; scripts/kube.sh down stops it" >&2
  exit 1
}

# wait_for NAME SECONDS CMD...: poll CMD until it succeeds, failing with
# NAME's log when NAME exits or the time is up.
wait_for() {
  local name=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    running "$name" || fail "$name" "exited during start-up"
    [ $SECONDS -lt $deadline ] || fail "$name" "not ready after $secs s"
    sleep 0.25
  done
}

kubectl() { "$BIN/kubectl" --kubeconfig "$STATE/kubeconfig" --request-timeout 30s "$@"; }

host_ip() {
  local ip
  ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
  [ -n "$ip" ] || ip=$(hostname -I 2>/dev/null | awk '{print $1}')
  [ -n "$ip" ] || die "cannot find this host's IPv4 address (no default route)"
  echo "$ip"
}

# ---------------------------------------------------------------- certificates

# make_certs: a CA; the API server's serving certificate, valid for every
# name a client inside or outside the cluster uses; one admin client
# certificate in system:masters that every component uses through one
# kubeconfig (the insecure port is gone upstream); the service-account key
# pair. Made once per state dir.
make_certs() {
  local d=$STATE/pki ip
  [ -f "$d/.done" ] && return
  ip=$(host_ip)
  rm -rf "$d"; mkdir -p "$d"
  (
    cd "$d"
    exec 2>openssl.log >&2
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj "/CN=orchard-kube-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver"
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=serverAuth" \
      "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:$ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster,DNS:kubernetes.default.svc.cluster.local" >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile apiserver.ext -out apiserver.crt
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=orchard-admin"
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=clientAuth" >admin.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile admin.ext -out admin.crt
    openssl genrsa -out sa.key 2048
    openssl rsa -in sa.key -pubout -out sa.pub
  ) || { cat "$d/openssl.log" >&2; die "certificates: openssl failed"; }
  # The kubeconfig embeds the certificates so it still works when copied.
  cat >"$STATE/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: orchard-kube
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$d/ca.crt")
users:
- name: orchard-admin
  user:
    client-certificate-data: $(base64 -w0 "$d/admin.crt")
    client-key-data: $(base64 -w0 "$d/admin.key")
contexts:
- name: orchard-kube
  context: {cluster: orchard-kube, user: orchard-admin}
current-context: orchard-kube
KC
  chmod 600 "$STATE/kubeconfig" "$d"/*.key
  touch "$d/.done"
}

# ---------------------------------------------------------------- components

# --unsafe-no-fsync: the data lives only until `down`, and fsyncs on a
# shared CI disk only slow every write of the API server.
start_etcd() {
  command -v etcd >/dev/null || die "etcd: not installed (apt-get install etcd-server)"
  start etcd etcd --name local --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "local=http://127.0.0.1:$ETCD_PEER_PORT" \
    --logger zap --log-outputs stderr --unsafe-no-fsync
  wait_for etcd 30 curl -fsS "http://127.0.0.1:$ETCD_CLIENT_PORT/health"
}

# The ServiceAccount admission plugin is off without a real node: without
# kube-controller-manager (the kwok cluster) no namespace has a `default`
# ServiceAccount and every pod would be refused. With --node the
# controller-manager makes them and publishes kube-root-ca.crt, and the
# plugin is on, so that a pod gets its token as on any cluster: Orchard's
# server deployed by its chart talks to the API server with it (sandbox
# pods mount none). A cluster started without --node keeps its API server
# as it started when `up --node` adds the node.
start_apiserver() {
  local d=$STATE/pki admission=(--disable-admission-plugins ServiceAccount)
  [ -f "$STATE/node" ] && admission=()
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --bind-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
    --advertise-address "$(host_ip)" \
    --tls-cert-file "$d/apiserver.crt" --tls-private-key-file "$d/apiserver.key" \
    --client-ca-file "$d/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$d/sa.pub" --service-account-signing-key-file "$d/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC --allow-privileged=true \
    ${admission[@]+"${admission[@]}"} \
    --kubelet-client-certificate "$d/admin.crt" --kubelet-client-key "$d/admin.key" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --cert-dir "$STATE/pki/generated"
  # 4 s on an idle machine, 5-7 s under load; a cold page cache of the
  # 114 MB binary adds more.
  wait_for kube-apiserver 120 kubectl get --raw /readyz
}

start_scheduler() {
  local kc=$STATE/kubeconfig
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$kc" \
    --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" \
    --bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --leader-elect=false
  wait_for kube-scheduler 60 curl -fsSk "https://127.0.0.1:$SCHEDULER_PORT/healthz"
}

# kwok plays the kubelet for nodes labelled type=kwok: it keeps them Ready
# and takes their pods through Running (with a podIP from --cidr) to gone.
start_kwok() {
  start kwok "$BIN/kwok" --kubeconfig "$STATE/kubeconfig" --config "$BIN/kwok-stages.yaml" \
    --manage-nodes-with-label-selector type=kwok \
    --cidr "$KWOK_CIDR" --server-address "127.0.0.1:$KWOK_PORT" \
    --node-lease-duration-seconds 40
  # The lease is what kube-controller-manager (up --node) reads: without
  # it the simulated node is marked unreachable 40 s after start and
  # tainted, and its pods evicted.
  wait_for kwok 60 curl -fsS "http://127.0.0.1:$KWOK_PORT/healthz"
}

# The fake node takes up to 2000 pods; its taint keeps pods that do not
# tolerate it (that expect a real container) away from it.
create_kwok_node() {
  kubectl get node "$KWOK_NODE" >/dev/null 2>&1 && return
  kubectl create -f - >/dev/null <<NODE || fail kube-apiserver "cannot create node $KWOK_NODE"
apiVersion: v1
kind: Node
metadata:
  name: $KWOK_NODE
  labels:
    type: kwok
    kubernetes.io/hostname: $KWOK_NODE
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
spec:
  taints:
  - {key: kwok.x-k8s.io/node, value: fake, effect: NoSchedule}
status:
  capacity: {cpu: "64", memory: 256Gi, pods: "2000", ephemeral-storage: 100Ti}
  allocatable: {cpu: "64", memory: 256Gi, pods: "2000", ephemeral-storage: 100Ti}
NODE
}

node_ready() {
  [ "$(kubectl get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

# ---------------------------------------------------------------- real node

CNI_BRIDGE=orchkube0
# Host paths the kubelet, containerd and the CNI plugins create whatever
# their configuration says (device plugins, container log links, the CNI
# result cache, shim sockets). `down` removes the ones that did not exist
# before `up --node`.
HOST_PATHS=(/var/lib/kubelet /var/log/containers /var/log/pods /var/lib/cni /run/containerd)

ctr_() { timeout 30 ctr --address "$STATE/containerd/containerd.sock" --namespace k8s.io "$@"; }
node_name() { hostname | tr '[:upper:]' '[:lower:]'; }

# record_host_state notes, once per cluster, what `down` must restore.
record_host_state() {
  [ -f "$STATE/host/recorded" ] && return
  if [ -n "$(find /sys/fs/cgroup -maxdepth 2 -name kubepods 2>/dev/null)" ]; then
    die "node: a kubepods cgroup already exists: another kubelet runs on this host (or a previous one was not cleaned up: scripts/kube.sh down)"
  fi
  mkdir -p "$STATE/host"
  local p
  : >"$STATE/host/created-paths"
  for p in "${HOST_PATHS[@]}"; do [ -e "$p" ] || echo "$p" >>"$STATE/host/created-paths"; done
  cat /proc/sys/net/ipv4/ip_forward >"$STATE/host/ip_forward"
  ls /run/netns 2>/dev/null >"$STATE/host/netns" || true
  touch "$STATE/host/recorded"
}

# build_images makes the sandbox, agent and shell images (scripts/kubeimage)
# and imports them into containerd; there is no registry to pull from.
build_images() {
  local have
  have=$(ctr_ images ls -q 2>/dev/null || true)
  # The agent image holds bin/orchard-agent: a newer build makes new images.
  if grep -qx "$SHELL_IMAGE" <<<"$have" && grep -qx "$AGENT_IMAGE" <<<"$have" &&
    grep -qx "$PAUSE_IMAGE" <<<"$have" && [ -f "$STATE/images.tar" ] &&
    ! [ "$REPO/bin/orchard-agent" -nt "$STATE/images.tar" ]; then
    return
  fi
  need_go
  if [ ! -x "$REPO/bin/orchard-agent" ]; then
    log "building bin/orchard-agent"
    (cd "$REPO" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o bin/orchard-agent ./cmd/orchard-agent) ||
      die "images: go build of cmd/orchard-agent failed"
  fi
  (cd "$REPO" && nice -n 10 timeout 600 go run ./scripts/kubeimage -out "$STATE/images.tar" \
    -agent bin/orchard-agent -busybox /bin/busybox \
    -pause-image "$PAUSE_IMAGE" -agent-image "$AGENT_IMAGE" -shell-image "$SHELL_IMAGE") ||
    die "images: scripts/kubeimage failed"
  timeout 120 ctr --address "$STATE/containerd/containerd.sock" --namespace k8s.io images import "$STATE/images.tar" >/dev/null ||
    fail containerd "ctr images import $STATE/images.tar failed"
}

# containerd gets its own root, state and socket, so it neither needs nor
# disturbs a containerd the host may run.
start_containerd() {
  local d=$STATE/containerd
  mkdir -p "$d" "$STATE/cni/net.d"
  # One bridge network for the node's pods. containerd brings up each pod's
  # lo itself with the loopback plugin, and reads only the first conflist.
  # No IP masquerade: pods reach the host through the bridge's gateway
  # address, and need no iptables.
  cat >"$STATE/cni/net.d/10-orchard-kube.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "orchard-kube",
  "plugins": [{
    "type": "bridge", "bridge": "$CNI_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
             "dataDir": "$STATE/cni/ipam"}
  }]
}
CNI
  # restrict_oom_score_adj: without CAP_SYS_RESOURCE (as in this VM) runc
  # cannot lower a container's oom_score_adj, and every sandbox fails to
  # start with "can't get final child's PID from pipe: EOF".
  # cgroupfs: there is no systemd to delegate cgroups to.
  cat >"$d/config.toml" <<TOML
version = 2
root = "$d/root"
state = "$d/state"
[grpc]
  address = "$d/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
    max_conf_num = 1
TOML
  start containerd containerd --config "$d/config.toml"
  wait_for containerd 60 ctr --address "$d/containerd.sock" version
}

start_controller_manager() {
  local kc=$STATE/kubeconfig d=$STATE/pki
  start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$kc" \
    --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" \
    --bind-address 127.0.0.1 --secure-port "$CONTROLLER_MANAGER_PORT" --leader-elect=false \
    --service-account-private-key-file "$d/sa.key" --root-ca-file "$d/ca.crt" \
    --cluster-signing-cert-file "$d/ca.crt" --cluster-signing-key-file "$d/ca.key" \
    --node-monitor-grace-period 10m
  # On a loaded machine kwok renews its simulated node's lease late; with
  # the default 50 s grace the node lifecycle controller tainted the node
  # unreachable (and would evict its pods) in the middle of a test run.
  wait_for kube-controller-manager 60 curl -fsSk "https://127.0.0.1:$CONTROLLER_MANAGER_PORT/healthz"
}

# The kubelet: cgroup v1 needs failCgroupV1: false (still supported in 1.37,
# with a warning); image GC at 100/99 never collects the imported images,
# which cannot be pulled again; eviction thresholds are low so a busy CI
# disk does not evict test pods. It listens on the host IP, where the API
# server reaches it for exec and logs (the hostname may resolve to
# 127.0.0.1, hence --kubelet-preferred-address-types on the API server).
start_kubelet() {
  local d=$STATE/kubelet ip
  ip=$(host_ip)
  mkdir -p "$d/root" "$d/pki" "$d/pod-logs"
  cat >"$d/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$STATE/containerd/containerd.sock
address: $ip
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  x509: {clientCAFile: $STATE/pki/ca.crt}
  webhook: {enabled: false}
  anonymous: {enabled: false}
authorization: {mode: AlwaysAllow}
podLogsDir: $d/pod-logs
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}
failSwapOn: false
serializeImagePulls: false
YAML
  start kubelet "$BIN/kubelet" --config "$d/config.yaml" --kubeconfig "$STATE/kubeconfig" \
    --root-dir "$d/root" --cert-dir "$d/pki" --node-ip "$ip"
  wait_for kubelet 60 curl -fsS "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz"
  node_name >"$STATE/node-name"
}

# check_pod runs the pod shape the kube runtime uses: an init container
# copies the agent into an emptyDir, the shell image's container runs.
check_pod() {
  local ns=kube-system pod=orchard-node-check
  kubectl -n $ns delete pod $pod --ignore-not-found --grace-period=0 --force >/dev/null 2>&1 || true
  kubectl -n $ns create -f - >/dev/null <<POD || fail kubelet "cannot create the check pod"
apiVersion: v1
kind: Pod
metadata: {name: $pod}
spec:
  nodeName: $(cat "$STATE/node-name")
  terminationGracePeriodSeconds: 1
  volumes: [{name: agent, emptyDir: {}}]
  initContainers:
  - {name: agent, image: $AGENT_IMAGE, imagePullPolicy: Never,
     command: [/bin/cp, /orchard-agent, /agent/orchard-agent], volumeMounts: [{name: agent, mountPath: /agent}]}
  containers:
  - {name: shell, image: $SHELL_IMAGE, imagePullPolicy: Never,
     command: [/bin/sh, -c, "test -x /agent/orchard-agent && exec sleep 3600"],
     volumeMounts: [{name: agent, mountPath: /agent}]}
POD
  wait_for kubelet 90 kubectl -n $ns wait --for=condition=Ready pod/$pod --timeout=2s
  log "check pod Running on $(cat "$STATE/node-name") with IP $(kubectl -n $ns get pod $pod -o 'jsonpath={.status.podIP}')"
  kubectl -n $ns delete pod $pod --wait=false >/dev/null
}

up_node() {
  record_host_state
  start_containerd
  build_images
  start_controller_manager
  local fresh=1
  running kubelet && fresh=0
  start_kubelet
  wait_for kubelet 60 node_ready "$(cat "$STATE/node-name")"
  [ $fresh -eq 0 ] || check_pod
}

# down_node: pods first, through the kubelet, so the CNI plugin releases
# their addresses and network namespaces; then whatever is left by force.
down_node() {
  local sock=$STATE/containerd/containerd.sock node c
  node=$(cat "$STATE/node-name" 2>/dev/null || true)
  if [ -n "$node" ] && running kubelet && running kube-apiserver; then
    timeout 60 "$BIN/kubectl" --kubeconfig "$STATE/kubeconfig" delete pods -A --field-selector "spec.nodeName=$node" \
      --grace-period=1 --timeout=45s >/dev/null 2>&1 || log "some pods on $node did not stop in 45 s; killing them"
  fi
  stop kubelet
  stop kube-controller-manager
  if running containerd; then
    for c in $(ctr_ tasks ls -q 2>/dev/null); do
      ctr_ tasks kill -s SIGKILL "$c" >/dev/null 2>&1 || true
    done
    sleep 0.5
    for c in $(ctr_ containers ls -q 2>/dev/null); do
      ctr_ tasks delete -f "$c" >/dev/null 2>&1 || true
      ctr_ containers delete "$c" >/dev/null 2>&1 || true
    done
  fi
  stop containerd
  # Shims outlive containerd; ours are the ones started with its socket.
  local pids
  pids=$(pgrep -f -- "-address $sock" || true)
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  # Anything still in the kubelet's cgroups is a container of ours
  # (up --node refuses to start beside another kubelet).
  pids=$(cat /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
    /sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs 2>/dev/null | sort -u || true)
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  sleep 0.5
  clean_host
}

# clean_host undoes what the kubelet, containerd and CNI did to the host.
clean_host() {
  local m p t n
  # Mounts under the state dir (the kubelet bind-mounts its root dir,
  # containerd mounts rootfs, shm and volumes), deepest first.
  for m in $(awk -v s="$STATE/" 'index($5, s) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
  done
  # Network namespaces of pods that were not torn down through the kubelet.
  for n in $(ls /run/netns 2>/dev/null | grep '^cni-' || true); do
    grep -qx "$n" "$STATE/host/netns" 2>/dev/null && continue
    umount "/run/netns/$n" 2>/dev/null || umount -l "/run/netns/$n" 2>/dev/null || true
    rm -f "/run/netns/$n"
  done
  # The kubepods cgroups, in every hierarchy, leaves first.
  for p in $(find /sys/fs/cgroup -maxdepth 2 -type d -name kubepods 2>/dev/null); do
    find "$p" -depth -type d -exec rmdir {} + 2>/dev/null || log "cannot remove cgroup $p"
  done
  # iptables chains the kubelet adds (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
  # KUBE-IPTABLES-HINT) when iptables is installed.
  for t in iptables ip6tables; do
    command -v $t >/dev/null || continue
    for p in filter nat mangle; do
      $t -t $p -S 2>/dev/null | grep -E '^-A .* -j KUBE-' | sed 's/^-A/-D/' |
        while read -r rule; do eval "$t -t $p $rule" 2>/dev/null || true; done || true
      for n in $($t -t $p -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ { print $2 }'); do
        $t -t $p -F "$n" 2>/dev/null || true
        $t -t $p -X "$n" 2>/dev/null || true
      done
    done
  done
  ip link del "$CNI_BRIDGE" 2>/dev/null || true
  if [ -f "$STATE/host/ip_forward" ]; then cat "$STATE/host/ip_forward" >/proc/sys/net/ipv4/ip_forward; fi
  if [ -f "$STATE/host/created-paths" ]; then
    while read -r p; do
      awk -v s="$p/" 'index($5, s) == 1 { print $5 }' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
      rm -rf "$p"
    done <"$STATE/host/created-paths"
  fi
  rm -rf "$STATE/containerd" "$STATE/kubelet" "$STATE/cni" "$STATE/host" "$STATE/node-name" "$STATE/images.tar"
}

up() {
  local node=0
  case "${1:-}" in
    "") ;;
    --node) node=1 ;;
    *) die "usage: scripts/kube.sh up [--node]" ;;
  esac
  [ "$(id -u)" -eq 0 ] || [ $node -eq 0 ] || die "up --node runs containerd and the kubelet (cgroups, mounts, network) and needs root"
  install_packages "${CORE_PACKAGES[@]}"
  [ $node -eq 0 ] || install_packages "${NODE_PACKAGES[@]}"
  if [ $node -eq 1 ]; then build --all; else build; fi
  mkdir -p "$STATE"
  # A cluster started without --node gains a node on `up --node`, never
  # loses it on a later plain `up`.
  [ $node -eq 0 ] || touch "$STATE/node"
  make_certs
  start_etcd
  start_apiserver
  start_scheduler
  start_kwok
  create_kwok_node
  wait_for kwok 60 node_ready "$KWOK_NODE"
  # The API server taints every new node not-ready (TaintNodesByCondition);
  # kube-controller-manager lifts the taint once the node is Ready, but the
  # kwok-only cluster runs none, so lift it here.
  if kubectl get node "$KWOK_NODE" -o 'jsonpath={.spec.taints[*].key}' | grep -qw node.kubernetes.io/not-ready; then
    kubectl taint node "$KWOK_NODE" node.kubernetes.io/not-ready:NoSchedule- >/dev/null ||
      fail kube-apiserver "cannot remove the not-ready taint of $KWOK_NODE"
  fi
  if [ -f "$STATE/node" ]; then up_node; fi
  print_env
}

print_env() {
  log "cluster is up; state, logs and pids in $STATE"
  if [ -f "$STATE/node" ]; then
    echo "ORCHARD_KUBE_AGENT_IMAGE=$AGENT_IMAGE"
    echo "KUBECONFIG=$STATE/kubeconfig"
    echo "ORCHARD_KUBE_SHELL_IMAGE=$SHELL_IMAGE"
  else
    echo "KUBECONFIG=$STATE/kubeconfig"
  fi
}

env_cmd() {
  running kube-apiserver && kubectl get --raw /readyz >/dev/null 2>&1 ||
    die "no cluster is running under $STATE (start one with scripts/kube.sh up)"
  if [ -f "$STATE/node" ]; then
    running kubelet || die "the cluster under $STATE was started with --node but its kubelet is not running"
  fi
  print_env 2>/dev/null
}

# down stops in the reverse order of up: the node first (its pods, then the
# kubelet, then containerd), then the control plane, etcd last.
down() {
  [ -d "$STATE" ] || { log "nothing to stop under $STATE"; return; }
  if [ -f "$STATE/node" ]; then down_node; fi
  local c
  for c in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$c"; done
  # Certificates and logs stay for the next `up` and for reading after a
  # failure; the cluster's data goes, so the next `up` starts empty.
  rm -rf "$STATE/etcd" "$STATE/pids" "$STATE/node"
  log "stopped; logs are kept in $STATE/logs"
}

cmd=${1:-}
shift || true
case "$cmd" in
  build) build "$@" ;;
  up) up "$@" ;;
  down) down ;;
  env) env_cmd ;;
  *)
    echo "usage: scripts/kube.sh build [--all] | up [--node] | down | env" >&2
    exit 2 ;;
esac
