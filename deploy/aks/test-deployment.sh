#!/usr/bin/env bash
# Smoke test of a deployed Orchard through its public API, with curl: a
# shell sandbox (create, wait, exec, write and read a file, delete) and,
# when a browser image is configured, a browser sandbox's step. Works
# against any cluster: with ORCHARD_URL it talks to that address, without
# it to the release's Service through kubectl port-forward.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<'USAGE'
usage: deploy/aks/test-deployment.sh [--dry-run]

Environment (defaults in brackets):
  ORCHARD_URL      the API [kubectl port-forward to the release's Service]
  ORCHARD_API_KEY  an API key [read from the release's Secret with kubectl]
  RELEASE          Helm release [orchard]
  NAMESPACE        namespace of the server [orchard]
  SERVICE          the server's Service [RELEASE, or RELEASE-orchard]
  SHELL_IMAGE      image of the shell sandbox ["": the server's default]
  BROWSER_IMAGE    image of the browser sandbox; "": the server's default when it has one
                   (read from the Deployment with kubectl), "none": skip [""]
  READY_TIMEOUT    seconds a sandbox may take to become ready [300]
  LOCAL_PORT       local port of the port-forward [18080]

--dry-run prints every kubectl and curl command instead of running it.
USAGE
}

parse_common "$@"
[ ${#ARGS[@]} -eq 0 ] || die "unexpected argument: ${ARGS[0]} (see --help)"

RELEASE=${RELEASE:-orchard}
NAMESPACE=${NAMESPACE:-orchard}
case $RELEASE in
*orchard*) SERVICE=${SERVICE:-$RELEASE} ;;
*) SERVICE=${SERVICE:-$RELEASE-orchard} ;;
esac
ORCHARD_URL=${ORCHARD_URL:-}
ORCHARD_API_KEY=${ORCHARD_API_KEY:-}
SHELL_IMAGE=${SHELL_IMAGE:-}
BROWSER_IMAGE=${BROWSER_IMAGE:-}
READY_TIMEOUT=${READY_TIMEOUT:-300}
LOCAL_PORT=${LOCAL_PORT:-18080}

need curl
if [ -z "$ORCHARD_URL" ] || [ -z "$ORCHARD_API_KEY" ]; then
  need kubectl
fi

sandboxes=()
pf=""
cleanup() {
  local id
  for id in "${sandboxes[@]}"; do
    curl -sS -o /dev/null -X DELETE -H "X-API-Key: $ORCHARD_API_KEY" "$ORCHARD_URL/sandboxes/$id" || true
  done
  if [ -n "$pf" ]; then kill "$pf" 2>/dev/null || true; fi
}
[ "$DRY_RUN" = 1 ] || trap cleanup EXIT

if [ -z "$ORCHARD_URL" ]; then
  ORCHARD_URL=http://127.0.0.1:$LOCAL_PORT
  say "port-forward to service $NAMESPACE/$SERVICE on $ORCHARD_URL"
  if [ "$DRY_RUN" = 1 ]; then
    show kubectl port-forward --namespace "$NAMESPACE" "service/$SERVICE" "$LOCAL_PORT:8080" >&3
  else
    port=$(kubectl get service --namespace "$NAMESPACE" "$SERVICE" --output 'jsonpath={.spec.ports[0].port}') ||
      die "no service $NAMESPACE/$SERVICE: set RELEASE and NAMESPACE, or ORCHARD_URL"
    kubectl port-forward --namespace "$NAMESPACE" "service/$SERVICE" "$LOCAL_PORT:$port" >/dev/null 2>&1 &
    pf=$!
    for _ in $(seq 50); do
      curl -fsS -o /dev/null "$ORCHARD_URL/health" 2>/dev/null && break
      kill -0 "$pf" 2>/dev/null || die "kubectl port-forward to $NAMESPACE/$SERVICE exited"
      sleep 0.2
    done
  fi
fi
ORCHARD_URL=${ORCHARD_URL%/}

if [ -z "$ORCHARD_API_KEY" ]; then
  say "API key from secret $NAMESPACE/$SERVICE-api-keys"
  keys=$(capture key kubectl get secret --namespace "$NAMESPACE" "$SERVICE-api-keys" --output 'jsonpath={.data.API_KEYS}')
  if [ "$DRY_RUN" != 1 ]; then
    [ -n "$keys" ] || die "no API key: set ORCHARD_API_KEY"
    ORCHARD_API_KEY=$(base64 -d <<<"$keys" | tr -s ', \t' '\n' | head -n 1)
  fi
fi

if [ -z "$BROWSER_IMAGE" ] && [ "$DRY_RUN" != 1 ] && ! command -v kubectl >/dev/null 2>&1; then
  say "no kubectl to read the server's browser image from its Deployment"
  BROWSER_IMAGE=none
fi
if [ -z "$BROWSER_IMAGE" ]; then
  BROWSER_IMAGE=$(capture browserImage kubectl get deployment --namespace "$NAMESPACE" "$SERVICE" \
    --output 'jsonpath={.spec.template.spec.containers[0].env[?(@.name=="ORCHARD_KUBE_BROWSER_IMAGE")].value}' 2>/dev/null || true)
  # The server's default applies: the create names no image.
  [ -n "$BROWSER_IMAGE" ] && BROWSER_IMAGE=default || BROWSER_IMAGE=none
fi

# api METHOD PATH [BODY] prints the response body; an HTTP error fails the
# test with the server's answer. The key never reaches the output.
api() {
  local method=$1 path=$2 body=${3:-}
  local args=(-sS -X "$method" -H "X-API-Key: $ORCHARD_API_KEY" -H 'Content-Type: application/json'
    -w '\n%{http_code}' --max-time $((READY_TIMEOUT + 60)))
  [ -n "$body" ] && args+=(--data "$body")
  if [ "$DRY_RUN" = 1 ]; then
    local shown=(curl "${args[@]}" "$ORCHARD_URL$path")
    shown[5]="X-API-Key: \$ORCHARD_API_KEY"
    show "${shown[@]}" >&3
    return 0
  fi
  local out code
  out=$(curl "${args[@]}" "$ORCHARD_URL$path") || die "$method $path: curl failed"
  code=${out##*$'\n'}
  out=${out%$'\n'*}
  [[ $code == 2* ]] || die "$method $path: HTTP $code: $out"
  printf '%s' "$out"
}

# expect fails unless the response has every fixed string given.
expect() {
  local what=$1 resp=$2
  shift 2
  [ "$DRY_RUN" = 1 ] && return 0
  local s
  for s in "$@"; do
    [[ $resp == *"$s"* ]] || die "$what: expected $s in: $resp"
  done
  say "ok: $what"
}

field() { sed -n "s/.*\"$1\": *\"\\([^\"]*\\)\".*/\\1/p" <<<"$2" | head -n 1; }

# create KIND IMAGE prints the new sandbox's id once it is ready.
create() {
  local kind=$1 image=$2 resp id
  resp=$(api POST /sandboxes "{\"image\":\"$image\",\"kind\":\"$kind\",\"block_network\":true,\"ttl_seconds\":900}")
  id=$(field sandbox_id "$resp")
  [ "$DRY_RUN" = 1 ] && id='<sandbox_id>'
  [ -n "$id" ] || die "create $kind sandbox: no sandbox_id in: $resp"
  sandboxes+=("$id")
  resp=$(api GET "/sandboxes/$id/wait?timeout=$READY_TIMEOUT")
  expect "$kind sandbox $id ready" "$resp" '"status":"ready"'
  echo "$id"
}

resp=$(api GET /health)
expect "health" "$resp" healthy

say "shell sandbox (image: ${SHELL_IMAGE:-default of the server})"
id=$(create shell "$SHELL_IMAGE")
sandboxes=("$id")
marker=orchard-smoke-$$
resp=$(api POST "/sandboxes/$id/exec" "{\"command\":\"echo $marker; uname -s\",\"wait\":true,\"timeout_seconds\":60}")
expect "exec" "$resp" "$marker" '"exit_code":0' '"status":"succeeded"'

content=$(printf 'hello from %s\n' "$marker" | base64 | tr -d '\n')
resp=$(api POST "/sandboxes/$id/files" "{\"path\":\"/workspace/smoke.txt\",\"content\":\"$content\"}")
expect "write file" "$resp" '"success":true'
resp=$(api GET "/sandboxes/$id/files?path=/workspace/smoke.txt")
expect "read file" "$resp" "\"content\":\"$content\""

if [ "$BROWSER_IMAGE" = none ]; then
  say "skipped: browser step (the server has no browser image; set BROWSER_IMAGE to test one)"
else
  image=$BROWSER_IMAGE
  [ "$image" = default ] && image=""
  say "browser sandbox (image: ${image:-default of the server})"
  bid=$(create browser "$image")
  sandboxes+=("$bid")
  resp=$(api POST "/sandboxes/$bid/browser/actions" \
    '{"actions":[{"type":"navigate","url":"data:text/html,<title>orchard-smoke</title><h1>hi</h1>"}],"observe":{"screenshot":"none","text":true}}')
  expect "browser step" "$resp" '"ok":true' 'orchard-smoke'
fi

for sid in "${sandboxes[@]}"; do
  resp=$(api DELETE "/sandboxes/$sid")
  expect "delete $sid" "$resp" '"status":"deleted"'
done
sandboxes=()
say "smoke test passed against $ORCHARD_URL"
