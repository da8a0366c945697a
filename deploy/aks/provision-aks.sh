#!/usr/bin/env bash
# Makes what Orchard needs on Azure: a resource group, an AKS cluster whose
# CNI enforces NetworkPolicies, a container registry it may pull from, an
# Azure Cache for Redis, and (optionally) a node pool for sandboxes only.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<'USAGE'
usage: deploy/aks/provision-aks.sh [--dry-run]

Environment (defaults in brackets):
  RESOURCE_GROUP      resource group [orchard-rg]
  CLUSTER_NAME        AKS cluster [orchard-aks]
  LOCATION            Azure region [eastus]
  VM_SIZE             system pool VM size [Standard_D4s_v3]
  NODE_COUNT          system pool nodes [3]
  MAX_PODS            pods per node [110]: each sandbox is a pod, and Azure CNI's default is 30
  NETWORK_POLICY      azure or calico: the policy engine [azure]
  KUBERNETES_VERSION  AKS version [the region's default]
  ACR_NAME            container registry name, globally unique, alphanumeric (required)
  ACR_SKU             Basic, Standard or Premium [Standard]
  REDIS_NAME          Azure Cache for Redis name, globally unique [CLUSTER_NAME-redis]
  REDIS_SKU           Basic, Standard or Premium [Standard]
  REDIS_VM_SIZE       cache size: c0..c6 (Basic/Standard), p1..p5 (Premium) [c1]
  SKIP_REDIS          1: no Azure Cache for Redis (the chart's in-cluster Redis, for trying) [0]
  SANDBOX_NODE_COUNT  nodes of a separate sandbox pool (label and taint workload=sandbox); 0: none [0]
  SANDBOX_VM_SIZE     its VM size [VM_SIZE]
  KUBECONFIG          where az aks get-credentials writes [~/.kube/config]

--dry-run prints every az command instead of running it.
USAGE
}

parse_common "$@"
[ ${#ARGS[@]} -eq 0 ] || die "unexpected argument: ${ARGS[0]} (see --help)"

RESOURCE_GROUP=${RESOURCE_GROUP:-orchard-rg}
CLUSTER_NAME=${CLUSTER_NAME:-orchard-aks}
LOCATION=${LOCATION:-eastus}
VM_SIZE=${VM_SIZE:-Standard_D4s_v3}
NODE_COUNT=${NODE_COUNT:-3}
MAX_PODS=${MAX_PODS:-110}
NETWORK_POLICY=${NETWORK_POLICY:-azure}
KUBERNETES_VERSION=${KUBERNETES_VERSION:-}
ACR_NAME=${ACR_NAME:-}
ACR_SKU=${ACR_SKU:-Standard}
REDIS_NAME=${REDIS_NAME:-$CLUSTER_NAME-redis}
REDIS_SKU=${REDIS_SKU:-Standard}
REDIS_VM_SIZE=${REDIS_VM_SIZE:-c1}
SKIP_REDIS=${SKIP_REDIS:-0}
SANDBOX_NODE_COUNT=${SANDBOX_NODE_COUNT:-0}
SANDBOX_VM_SIZE=${SANDBOX_VM_SIZE:-$VM_SIZE}

need_var ACR_NAME
[[ $ACR_NAME =~ ^[a-zA-Z0-9]{5,50}$ ]] || die "ACR_NAME must be 5 to 50 letters and digits: $ACR_NAME"
case $NETWORK_POLICY in
azure | calico) ;;
*) die "NETWORK_POLICY must be azure or calico (without a policy engine sandboxes are not isolated): $NETWORK_POLICY" ;;
esac
need az
need_az_login

say "resource group $RESOURCE_GROUP in $LOCATION"
run az group create --name "$RESOURCE_GROUP" --location "$LOCATION" --output none

say "container registry $ACR_NAME"
run az acr create --resource-group "$RESOURCE_GROUP" --name "$ACR_NAME" --sku "$ACR_SKU" --location "$LOCATION" --output none

say "AKS cluster $CLUSTER_NAME: $NODE_COUNT x $VM_SIZE, network policy $NETWORK_POLICY"
create=(az aks create --resource-group "$RESOURCE_GROUP" --name "$CLUSTER_NAME" --location "$LOCATION"
  --node-count "$NODE_COUNT" --node-vm-size "$VM_SIZE" --max-pods "$MAX_PODS"
  --network-plugin azure --network-policy "$NETWORK_POLICY"
  --attach-acr "$ACR_NAME" --enable-managed-identity --generate-ssh-keys --output none)
[ -n "$KUBERNETES_VERSION" ] && create+=(--kubernetes-version "$KUBERNETES_VERSION")
run "${create[@]}"

if [ "$SANDBOX_NODE_COUNT" -gt 0 ]; then
  # Sandboxes only: the taint keeps everything else off, the label is what
  # the chart's sandbox.nodeSelector names.
  say "sandbox node pool: $SANDBOX_NODE_COUNT x $SANDBOX_VM_SIZE"
  run az aks nodepool add --resource-group "$RESOURCE_GROUP" --cluster-name "$CLUSTER_NAME" --name sandbox \
    --node-count "$SANDBOX_NODE_COUNT" --node-vm-size "$SANDBOX_VM_SIZE" --max-pods "$MAX_PODS" \
    --labels workload=sandbox --node-taints workload=sandbox:NoSchedule --output none
fi

if [ "$SKIP_REDIS" != 1 ]; then
  # TLS only (port 6380), the access key as password: deploy-orchard.sh
  # reads both and hands them to the chart.
  say "Azure Cache for Redis $REDIS_NAME ($REDIS_SKU $REDIS_VM_SIZE; creating one takes 15-20 minutes)"
  run az redis create --resource-group "$RESOURCE_GROUP" --name "$REDIS_NAME" --location "$LOCATION" \
    --sku "$REDIS_SKU" --vm-size "$REDIS_VM_SIZE" --minimum-tls-version 1.2 --output none
fi

say "credentials of $CLUSTER_NAME"
creds=(az aks get-credentials --resource-group "$RESOURCE_GROUP" --name "$CLUSTER_NAME" --overwrite-existing)
[ -n "${KUBECONFIG:-}" ] && creds+=(--file "$KUBECONFIG")
run "${creds[@]}"

cat >&2 <<NEXT

Next:
  export RESOURCE_GROUP=$RESOURCE_GROUP CLUSTER_NAME=$CLUSTER_NAME ACR_NAME=$ACR_NAME$([ "$SKIP_REDIS" != 1 ] && echo " REDIS_NAME=$REDIS_NAME")
  deploy/aks/build-and-push.sh     # images into $ACR_NAME.azurecr.io/orchard
  deploy/aks/deploy-orchard.sh     # helm upgrade --install$([ "$SANDBOX_NODE_COUNT" -gt 0 ] && echo ", SANDBOX_POOL=1 for the sandbox pool")
  deploy/aks/test-deployment.sh    # smoke test through the API
NEXT
