#!/usr/bin/env bash
# Builds the helm CLI from the Go module proxy into a cache, once, and
# prints its path. Orchard's go.mod does not require Helm (it would pull in
# hundreds of modules); the chart's tests and deploy scripts use this binary.
#   deploy/helm.sh            build if missing, print the path
#   deploy/helm.sh -- ARGS    build if missing, then run helm ARGS
# HELM_VERSION (default v3.19.0) and ORCHARD_HELM_CACHE
# (default ~/.cache/orchard/helm) override where and what.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.19.0}
cache=${ORCHARD_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/orchard/helm}
dir=$cache/$HELM_VERSION
bin=$dir/helm

if ! [ -x "$bin" ]; then
  if ! command -v go >/dev/null 2>&1; then
    if [ -x /usr/local/go/bin/go ]; then
      PATH=/usr/local/go/bin:$PATH
    else
      echo "deploy/helm.sh: building helm needs Go (https://go.dev/dl/)" >&2
      exit 1
    fi
  fi
  mkdir -p "$dir"
  # A lock, so that two test processes do not build into the same place.
  exec 9>"$dir/.lock"
  flock 9
  if ! [ -x "$bin" ]; then
    echo "deploy/helm.sh: building helm $HELM_VERSION into $dir (a few minutes, once)" >&2
    # Outside any module, so the project's go.mod is left alone.
    (cd "$dir" && GOBIN="$dir/tmp" GOFLAGS=-mod=mod GO111MODULE=on \
      go install -trimpath "helm.sh/helm/v3/cmd/helm@$HELM_VERSION") >"$dir/build.log" 2>&1 || {
      echo "deploy/helm.sh: go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed; last lines of $dir/build.log:" >&2
      tail -n 20 "$dir/build.log" >&2
      exit 1
    }
    mv "$dir/tmp/helm" "$bin"
    rmdir "$dir/tmp"
  fi
  exec 9>&-
fi

if [ "${1:-}" = "--" ]; then
  shift
  exec "$bin" "$@"
fi
echo "$bin"
