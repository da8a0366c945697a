// Package deploy holds no code: it is Orchard's deployment (the Helm chart
// in helm/orchard, the kustomize manifests rendered from it, the AKS
// scripts) and the tests that keep them correct: the chart renders into
// objects Kubernetes accepts, grants exactly what runtime/kube asks for,
// and agrees with the policies the server applies; the manifests match the
// chart; the scripts pass shellcheck and print what they would run.
package deploy
