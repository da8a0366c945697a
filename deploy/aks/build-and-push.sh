#!/usr/bin/env bash
# Builds Orchard's images and pushes them to a registry, one per call of
# the image builder (go run ./deploy/images --push REF NAME): no Docker
# needed. Works with any registry; with ACR_NAME it logs in to that Azure
# Container Registry first.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ALL_IMAGES="orchard-server orchard-agent orchard-shell orchard-browser orchard-desktop"

usage() {
  cat <<USAGE
usage: deploy/aks/build-and-push.sh [--dry-run] [IMAGE...]

Builds and pushes IMAGE (default: all of $ALL_IMAGES)
as \$REGISTRY/IMAGE:\$TAG and prints each image's digest.

Environment (defaults in brackets):
  REGISTRY   registry and path to push to, e.g. myacr.azurecr.io/orchard [ACR_NAME.azurecr.io/orchard]
  ACR_NAME   an Azure Container Registry to log in to (az acr login, no Docker needed)
  TAG        image tag [git describe --always --dirty, or dev]
  INSECURE   1: plain HTTP or a self-signed registry (passes --insecure) [0]
  DIGESTS    file to write "IMAGE@DIGEST" lines to [none]

Credentials for other registries come from the Docker config
(\$DOCKER_CONFIG/config.json or ~/.docker/config.json).
--dry-run prints every az and go command instead of running it.
USAGE
}

parse_common "$@"
images=("${ARGS[@]}")
[ ${#images[@]} -gt 0 ] || read -r -a images <<<"$ALL_IMAGES"
for i in "${images[@]}"; do
  case " $ALL_IMAGES " in
  *" $i "*) ;;
  *) die "unknown image $i (one of: $ALL_IMAGES)" ;;
  esac
done

ACR_NAME=${ACR_NAME:-}
REGISTRY=${REGISTRY:-${ACR_NAME:+$ACR_NAME.azurecr.io/orchard}}
need_var REGISTRY
REGISTRY=${REGISTRY%/}
TAG=${TAG:-$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo dev)}
INSECURE=${INSECURE:-0}
DIGESTS=${DIGESTS:-}

need go
[ -n "$ACR_NAME" ] && need az && need_az_login
if [ "$DRY_RUN" != 1 ] && ! [ -d "$ROOT/deploy/images" ]; then
  die "the image builder (deploy/images) is not in this checkout: update it, or push the images another way"
fi

if [ -n "$ACR_NAME" ]; then
  # An ACR token in a Docker config of our own: the builder reads Docker
  # configs, and no Docker daemon or CLI is needed.
  say "logging in to $ACR_NAME.azurecr.io"
  token=$(capture token az acr login --name "$ACR_NAME" --expose-token --output tsv --query accessToken)
  if [ "$DRY_RUN" != 1 ]; then
    DOCKER_CONFIG=$(mktemp -d)
    export DOCKER_CONFIG
    trap 'rm -rf "$DOCKER_CONFIG"' EXIT
    auth=$(printf '00000000-0000-0000-0000-000000000000:%s' "$token" | base64 -w0)
    printf '{"auths":{"%s.azurecr.io":{"auth":"%s"}}}\n' "$ACR_NAME" "$auth" >"$DOCKER_CONFIG/config.json"
  fi
fi

cd "$ROOT"
[ -n "$DIGESTS" ] && [ "$DRY_RUN" != 1 ] && : >"$DIGESTS"
for name in "${images[@]}"; do
  ref=$REGISTRY/$name:$TAG
  say "building and pushing $ref"
  # Flags before the name: the builder's flag parsing stops at the first
  # argument that is not one.
  cmd=(go run ./deploy/images --push "$ref")
  [ "$INSECURE" = 1 ] && cmd+=(--insecure)
  cmd+=("$name")
  if [ "$DRY_RUN" = 1 ]; then
    show "${cmd[@]}" >&3
    continue
  fi
  show "${cmd[@]}" >&2
  out=$("${cmd[@]}") || die "building $name failed"
  digest=$(tail -n 1 <<<"$out")
  echo "$REGISTRY/$name@$digest"
  [ -n "$DIGESTS" ] && echo "$REGISTRY/$name@$digest" >>"$DIGESTS"
done

say "done: deploy with REGISTRY=$REGISTRY TAG=$TAG deploy/aks/deploy-orchard.sh"
