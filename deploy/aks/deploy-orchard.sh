#!/usr/bin/env bash
# Installs or upgrades Orchard with the chart in deploy/helm/orchard, on the
# cluster of KUBECONFIG (AKS or any other), with the images of REGISTRY and
# a Redis store: Azure Cache for Redis (REDIS_NAME), any Redis (REDIS_URL)
# or, with neither, the chart's own for trying. --uninstall removes the
# release and waits until the sandbox pods are gone too.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<'USAGE'
usage: deploy/aks/deploy-orchard.sh [--dry-run] [--uninstall]

Environment (defaults in brackets):
  RELEASE            Helm release [orchard]
  NAMESPACE          namespace of the server [orchard]
  SANDBOX_NAMESPACE  namespace of the sandbox pods [sandbox-pods]
  REGISTRY           where build-and-push.sh pushed the images [ACR_NAME.azurecr.io/orchard]
  TAG                image tag [git describe --always --dirty, or dev]
  REDIS_NAME         Azure Cache for Redis to use (with RESOURCE_GROUP): URL and key read with az
  REDIS_URL          any other Redis: redis://host:6379/0 or rediss://host:6380/0
  REDIS_PASSWORD     its password, kept in a Secret (not in the URL)
  REDIS_CA_SECRET    Secret (in NAMESPACE, key ca.crt) with the CA of a rediss:// Redis on a private CA
  SANDBOX_POOL       1: sandboxes on the nodes labelled and tainted workload=sandbox [0]
  REPLICAS           server replicas [the chart's: 2 with Redis]
  SERVICE_TYPE       ClusterIP or LoadBalancer [ClusterIP]
  VALUES             extra values files for helm, space-separated
  HELM               helm binary [helm on PATH, else the one deploy/helm.sh builds]
  TIMEOUT            how long helm and the uninstall wait [10m]
  KUBECONFIG         the cluster, as for kubectl

--dry-run prints every az, kubectl and helm command instead of running it.
USAGE
}

parse_common "$@"
UNINSTALL=0
for a in "${ARGS[@]}"; do
  case $a in
  --uninstall) UNINSTALL=1 ;;
  *) die "unexpected argument: $a (see --help)" ;;
  esac
done

RELEASE=${RELEASE:-orchard}
NAMESPACE=${NAMESPACE:-orchard}
SANDBOX_NAMESPACE=${SANDBOX_NAMESPACE:-sandbox-pods}
TIMEOUT=${TIMEOUT:-10m}
CHART=$ROOT/deploy/helm/orchard
# Sandbox pods, their egress policies and the agents' key carry this label
# (runtime/kube: LabelManagedBy=ManagedBy).
MANAGED='app.kubernetes.io/managed-by=orchard'

need kubectl
if [ "$DRY_RUN" != 1 ] && [ -z "${HELM:-}" ] && ! command -v helm >/dev/null 2>&1 && ! command -v go >/dev/null 2>&1; then
  die "missing required tool: helm (install it, set HELM, or install Go so deploy/helm.sh can build it)"
fi
HELM_BIN=$(helm_bin)

if [ "$UNINSTALL" = 1 ]; then
  say "uninstalling release $RELEASE from $NAMESPACE"
  run "$HELM_BIN" uninstall "$RELEASE" --namespace "$NAMESPACE" --ignore-not-found --wait --timeout "$TIMEOUT"
  # The Redis password's Secret is this script's, not the release's:
  # helm leaves it.
  run kubectl delete secret "$RELEASE-redis-auth" --namespace "$NAMESPACE" --ignore-not-found
  # The server leaves its pods when it stops (a restarted one adopts
  # them): with the server gone, remove them, their egress policies and
  # the agents' token key.
  say "deleting sandbox pods in $SANDBOX_NAMESPACE"
  run kubectl delete pods,networkpolicies,secrets --namespace "$SANDBOX_NAMESPACE" --selector "$MANAGED" \
    --ignore-not-found --wait=false
  if [ "$DRY_RUN" = 1 ]; then
    show kubectl get pods --namespace "$SANDBOX_NAMESPACE" --selector "$MANAGED" --output name >&3
    exit 0
  fi
  secs=${TIMEOUT%m}
  [[ $secs =~ ^[0-9]+$ ]] && secs=$((secs * 60)) || secs=600
  deadline=$((SECONDS + secs))
  while :; do
    left=$(kubectl get pods --namespace "$SANDBOX_NAMESPACE" --selector "$MANAGED" --output name 2>/dev/null | wc -l)
    [ "$left" -eq 0 ] && break
    [ $SECONDS -ge $deadline ] && die "$left sandbox pod(s) still in $SANDBOX_NAMESPACE after $TIMEOUT: kubectl -n $SANDBOX_NAMESPACE get pods -l $MANAGED"
    say "$left sandbox pod(s) left"
    sleep 5
  done
  say "uninstalled: no sandbox pods left"
  exit 0
fi

ACR_NAME=${ACR_NAME:-}
REGISTRY=${REGISTRY:-${ACR_NAME:+$ACR_NAME.azurecr.io/orchard}}
need_var REGISTRY
TAG=${TAG:-$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo dev)}
REDIS_NAME=${REDIS_NAME:-}
REDIS_URL=${REDIS_URL:-}
REDIS_PASSWORD=${REDIS_PASSWORD:-}

if [ -n "$REDIS_NAME" ] && [ -z "$REDIS_URL" ]; then
  need_var RESOURCE_GROUP
  need az
  need_az_login
  say "reading Azure Cache for Redis $REDIS_NAME"
  host=$(capture host az redis show --resource-group "$RESOURCE_GROUP" --name "$REDIS_NAME" --query hostName --output tsv)
  port=$(capture sslPort az redis show --resource-group "$RESOURCE_GROUP" --name "$REDIS_NAME" --query sslPort --output tsv)
  REDIS_URL="rediss://$host:$port/0"
  REDIS_PASSWORD=$(capture key az redis list-keys --resource-group "$RESOURCE_GROUP" --name "$REDIS_NAME" --query primaryKey --output tsv)
fi

set_args=(--set-string "image.registry=$REGISTRY" --set-string "image.tag=$TAG"
  --set-string "sandboxNamespace.name=$SANDBOX_NAMESPACE")
if [ -n "$REDIS_URL" ]; then
  set_args+=(--set-string "redis.external.url=$REDIS_URL")
  if [ -n "$REDIS_PASSWORD" ]; then
    # The password goes into a Secret through stdin: never on a command
    # line, in the release's values or in this script's output.
    secret=$RELEASE-redis-auth
    say "Secret $NAMESPACE/$secret with the Redis password"
    if [ "$DRY_RUN" = 1 ]; then
      show kubectl create namespace "$NAMESPACE" --dry-run=client --output yaml >&3
      echo "+ kubectl create secret generic $secret --namespace $NAMESPACE --from-file=redis-password=/dev/stdin --dry-run=client --output yaml | kubectl apply --filename -" >&3
    else
      kubectl create namespace "$NAMESPACE" --dry-run=client --output yaml | kubectl apply --filename - >/dev/null
      printf '%s' "$REDIS_PASSWORD" |
        kubectl create secret generic "$secret" --namespace "$NAMESPACE" --from-file=redis-password=/dev/stdin \
          --dry-run=client --output yaml | kubectl apply --filename - >/dev/null
    fi
    set_args+=(--set-string "redis.external.existingSecret=$secret")
  fi
  [ -n "${REDIS_CA_SECRET:-}" ] && set_args+=(--set-string "redis.external.caSecret=$REDIS_CA_SECRET")
fi
if [ "${SANDBOX_POOL:-0}" = 1 ]; then
  set_args+=(--set-string "sandbox.nodeSelector.workload=sandbox"
    --set-string "sandbox.tolerations[0].key=workload" --set-string "sandbox.tolerations[0].value=sandbox"
    --set-string "sandbox.tolerations[0].effect=NoSchedule")
fi
[ -n "${REPLICAS:-}" ] && set_args+=(--set "replicaCount=$REPLICAS")
[ -n "${SERVICE_TYPE:-}" ] && set_args+=(--set-string "service.type=$SERVICE_TYPE")
for f in ${VALUES:-}; do
  set_args+=(--values "$f")
done

say "helm upgrade --install $RELEASE ($REGISTRY, tag $TAG, store: ${REDIS_URL:+external Redis}${REDIS_URL:-in-chart Redis})"
run "$HELM_BIN" upgrade --install "$RELEASE" "$CHART" --namespace "$NAMESPACE" --create-namespace \
  "${set_args[@]}" --wait --timeout "$TIMEOUT"
say "installed. Smoke test: RELEASE=$RELEASE NAMESPACE=$NAMESPACE deploy/aks/test-deployment.sh"
