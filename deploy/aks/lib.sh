# shellcheck shell=bash
# Shared by the deploy/aks scripts: --dry-run, tool checks, messages.
# Sourced, not run.

# A failing command inside $(...) fails the script, as it does outside.
shopt -s inherit_errexit

DRY_RUN=${DRY_RUN:-0}
# The script's own standard output, kept on fd 3: --dry-run prints
# commands there even from inside $(...).
exec 3>&1
# The repository's root, for the chart and the image builder.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

die() {
  echo "$(basename "$0"): $*" >&2
  exit 1
}

say() { echo "==> $*" >&2; }

# parse_common handles the flags every script takes; the rest are left in
# ARGS for the script.
parse_common() {
  ARGS=()
  while [ $# -gt 0 ]; do
    case $1 in
    --dry-run) DRY_RUN=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) ARGS+=("$1") ;;
    esac
    shift
  done
}

# show prints a command as it would be typed, quoted where needed.
show() {
  local out="+" a
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
      out+=" $a"
    else
      out+=" '${a//\'/\'\\\'\'}'"
    fi
  done
  echo "$out"
}

# run runs a command, or prints it under --dry-run.
run() {
  if [ "$DRY_RUN" = 1 ]; then
    show "$@" >&3
    return 0
  fi
  show "$@" >&2
  "$@"
}

# capture runs a command that reads something and prints its output; under
# --dry-run it prints the command and stands in <placeholder> for the output.
capture() {
  local placeholder=$1
  shift
  if [ "$DRY_RUN" = 1 ]; then
    show "$@" >&3
    echo "<$placeholder>"
    return 0
  fi
  "$@"
}

# need fails unless every tool is on PATH. Under --dry-run nothing runs,
# so nothing is needed.
need() {
  [ "$DRY_RUN" = 1 ] && return 0
  local t missing=()
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local hint=""
  for t in "${missing[@]}"; do
    case $t in
    az) hint+=$'\n  az: https://learn.microsoft.com/cli/azure/install-azure-cli (Debian: apt-get install azure-cli from Microsoft\'s repository)' ;;
    kubectl) hint+=$'\n  kubectl: https://kubernetes.io/docs/tasks/tools/ (or: az aks install-cli)' ;;
    helm) hint+=$'\n  helm: deploy/helm.sh builds it from the Go module proxy' ;;
    go) hint+=$'\n  go: https://go.dev/dl/ (Go 1.26)' ;;
    curl) hint+=$'\n  curl: apt-get install curl' ;;
    *) hint+=$'\n  '"$t" ;;
    esac
  done
  die "missing required tool(s): ${missing[*]}; install:$hint"
}

# need_az_login fails unless the Azure CLI has a logged-in account.
need_az_login() {
  [ "$DRY_RUN" = 1 ] && return 0
  az account show --output none >/dev/null 2>&1 ||
    die "the Azure CLI is not logged in: run 'az login' (and 'az account set --subscription ID')"
}

# need_var fails unless the named variable is set.
need_var() {
  local v
  for v in "$@"; do
    [ -n "${!v:-}" ] || die "set $v (see --help)"
  done
}

# helm_bin prints the helm to use: $HELM, helm on PATH, or the one
# deploy/helm.sh builds.
helm_bin() {
  if [ -n "${HELM:-}" ]; then
    echo "$HELM"
  elif command -v helm >/dev/null 2>&1; then
    command -v helm
  elif [ "$DRY_RUN" = 1 ]; then
    echo helm
  else
    "$ROOT/deploy/helm.sh"
  fi
}
