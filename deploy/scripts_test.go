package deploy_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// scripts are deploy's shell scripts, relative to the module root.
func scripts(t *testing.T) []string {
	t.Helper()
	root := moduleRoot(t)
	var out []string
	err := filepath.WalkDir(filepath.Join(root, "deploy"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".sh") {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestShellcheck(t *testing.T) {
	t.Parallel()
	sc, err := exec.LookPath("shellcheck")
	testenv.Require(t, "shellcheck", err == nil, "shellcheck is not installed (apt-get install shellcheck)")
	files := scripts(t)
	if len(files) < 6 {
		t.Fatalf("found only %v", files)
	}
	cmd := exec.Command(sc, append([]string{"--external-sources"}, files...)...)
	cmd.Dir = moduleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("shellcheck: %v\n%s", err, out)
	}
}

// runScript runs a deploy script with only the environment given (and a
// HOME of its own, so no real kubeconfig or Azure login is found).
func runScript(t *testing.T, path string, env []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{filepath.Join(moduleRoot(t), path)}, args...)...)
	cmd.Env = append([]string{"HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}, env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

func TestScriptsDryRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		script string
		env    []string
		args   []string
		want   []string // lines of standard output that must be there, as prefixes
		absent []string // text that must not be in any output
	}{
		{"provision with a sandbox pool", "deploy/aks/provision-aks.sh",
			[]string{"ACR_NAME=orchardtest", "RESOURCE_GROUP=rg-test", "CLUSTER_NAME=aks-test", "LOCATION=westeurope", "NETWORK_POLICY=calico", "SANDBOX_NODE_COUNT=2"}, nil,
			[]string{
				"+ az group create --name rg-test --location westeurope",
				"+ az acr create --resource-group rg-test --name orchardtest --sku Standard",
				"+ az aks create --resource-group rg-test --name aks-test --location westeurope --node-count 3 --node-vm-size Standard_D4s_v3 --max-pods 110 --network-plugin azure --network-policy calico --attach-acr orchardtest",
				"+ az aks nodepool add --resource-group rg-test --cluster-name aks-test --name sandbox --node-count 2 --node-vm-size Standard_D4s_v3 --max-pods 110 --labels workload=sandbox --node-taints workload=sandbox:NoSchedule",
				"+ az redis create --resource-group rg-test --name aks-test-redis --location westeurope --sku Standard --vm-size c1 --minimum-tls-version 1.2",
				"+ az aks get-credentials --resource-group rg-test --name aks-test",
			}, nil},
		{"provision without Redis", "deploy/aks/provision-aks.sh", []string{"ACR_NAME=orchardtest", "SKIP_REDIS=1", "REDIS_SKU=Premium"}, nil,
			[]string{"+ az aks create --resource-group orchard-rg --name orchard-aks --location eastus --node-count 3"},
			[]string{"az redis", "nodepool"}},
		{"build and push to ACR", "deploy/aks/build-and-push.sh", []string{"ACR_NAME=orchardtest", "TAG=v9"}, nil,
			[]string{
				"+ az acr login --name orchardtest --expose-token",
				"+ go run ./deploy/images --push orchardtest.azurecr.io/orchard/orchard-server:v9 orchard-server",
				"+ go run ./deploy/images --push orchardtest.azurecr.io/orchard/orchard-agent:v9 orchard-agent",
				"+ go run ./deploy/images --push orchardtest.azurecr.io/orchard/orchard-shell:v9 orchard-shell",
				"+ go run ./deploy/images --push orchardtest.azurecr.io/orchard/orchard-browser:v9 orchard-browser",
				"+ go run ./deploy/images --push orchardtest.azurecr.io/orchard/orchard-desktop:v9 orchard-desktop",
			}, nil},
		{"build and push one image to any registry", "deploy/aks/build-and-push.sh", []string{"REGISTRY=localhost:5000/o/", "TAG=v9", "INSECURE=1"}, []string{"orchard-agent"},
			[]string{"+ go run ./deploy/images --push localhost:5000/o/orchard-agent:v9 --insecure orchard-agent"},
			[]string{"az ", "orchard-server"}},
		{"deploy with Azure Cache for Redis", "deploy/aks/deploy-orchard.sh",
			[]string{"ACR_NAME=orchardtest", "REDIS_NAME=cache", "RESOURCE_GROUP=rg", "TAG=v9", "SANDBOX_POOL=1", "HELM=helm"}, nil,
			[]string{
				"+ az redis show --resource-group rg --name cache --query hostName --output tsv",
				"+ az redis list-keys --resource-group rg --name cache --query primaryKey --output tsv",
				"+ kubectl create secret generic orchard-redis-auth --namespace orchard --from-file=redis-password=/dev/stdin",
				"+ helm upgrade --install orchard ",
			}, nil},
		{"deploy with any Redis", "deploy/aks/deploy-orchard.sh",
			[]string{"REGISTRY=reg.example/o", "TAG=v9", "REDIS_URL=rediss://r.example:6380/0", "REDIS_PASSWORD=s3cret-pw", "HELM=helm", "REPLICAS=3"}, nil,
			[]string{"+ helm upgrade --install orchard "},
			[]string{"s3cret-pw", "az "}},
		{"uninstall", "deploy/aks/deploy-orchard.sh", []string{"HELM=helm", "SANDBOX_NAMESPACE=sb"}, []string{"--uninstall"},
			[]string{
				"+ helm uninstall orchard --namespace orchard",
				"+ kubectl delete secret orchard-redis-auth --namespace orchard --ignore-not-found",
				"+ kubectl delete pods,networkpolicies,secrets --namespace sb --selector app.kubernetes.io/managed-by=orchard",
				"+ kubectl get pods --namespace sb --selector app.kubernetes.io/managed-by=orchard",
			}, nil},
		{"smoke test without a browser", "deploy/aks/test-deployment.sh",
			[]string{"ORCHARD_URL=http://orchard.example:8080/", "ORCHARD_API_KEY=topsecret-key", "BROWSER_IMAGE=none"}, nil,
			[]string{
				"+ curl -sS -X GET -H 'X-API-Key: $ORCHARD_API_KEY'",
				`+ curl -sS -X POST -H 'X-API-Key: $ORCHARD_API_KEY' -H 'Content-Type: application/json' -w '\n%{http_code}' --max-time 360 --data '{"image":"","kind":"shell"`,
				`+ curl -sS -X GET -H 'X-API-Key: $ORCHARD_API_KEY' -H 'Content-Type: application/json' -w '\n%{http_code}' --max-time 360 'http://orchard.example:8080/sandboxes/<sandbox_id>/wait?timeout=300'`,
				"+ curl -sS -X DELETE",
			},
			[]string{"topsecret-key", "browser/actions", "kubectl"}},
		{"smoke test with a browser", "deploy/aks/test-deployment.sh",
			[]string{"ORCHARD_URL=http://orchard.example:8080", "ORCHARD_API_KEY=k", "BROWSER_IMAGE=reg.example/o/orchard-browser:v9", "SHELL_IMAGE=debian:12"}, nil,
			[]string{
				`+ curl -sS -X POST -H 'X-API-Key: $ORCHARD_API_KEY' -H 'Content-Type: application/json' -w '\n%{http_code}' --max-time 360 --data '{"image":"debian:12","kind":"shell"`,
				`+ curl -sS -X POST -H 'X-API-Key: $ORCHARD_API_KEY' -H 'Content-Type: application/json' -w '\n%{http_code}' --max-time 360 --data '{"image":"reg.example/o/orchard-browser:v9","kind":"browser"`,
				`+ curl -sS -X POST -H 'X-API-Key: $ORCHARD_API_KEY' -H 'Content-Type: application/json' -w '\n%{http_code}' --max-time 360 --data '{"actions":[{"type":"navigate"`,
			}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, err := runScript(t, tt.script, tt.env, append([]string{"--dry-run"}, tt.args...)...)
			if err != nil {
				t.Fatalf("%s --dry-run: %v\nstdout:\n%s\nstderr:\n%s", tt.script, err, stdout, stderr)
			}
			lines := strings.Split(stdout, "\n")
			for _, w := range tt.want {
				found := false
				for _, l := range lines {
					if strings.HasPrefix(l, w) {
						found = true
						break
					}
				}
				if !found {
					t.Errorf("no line starting %q in:\n%s", w, stdout)
				}
			}
			for _, a := range tt.absent {
				if strings.Contains(stdout+stderr, a) {
					t.Errorf("output contains %q:\n%s\n%s", a, stdout, stderr)
				}
			}
			for _, l := range lines {
				if l != "" && !strings.HasPrefix(l, "+ ") {
					t.Errorf("standard output line %q is not a command", l)
				}
			}
		})
	}
}

func TestDeployChartPath(t *testing.T) {
	t.Parallel()
	stdout, stderr, err := runScript(t, "deploy/aks/deploy-orchard.sh",
		[]string{"REGISTRY=reg.example/o", "TAG=v9", "HELM=helm", "SANDBOX_POOL=1", "REPLICAS=3"}, "--dry-run")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	want := "+ helm upgrade --install orchard " + filepath.Join(moduleRoot(t), "deploy/helm/orchard") +
		" --namespace orchard --create-namespace --set-string image.registry=reg.example/o --set-string image.tag=v9" +
		" --set-string sandboxNamespace.name=sandbox-pods --set-string sandbox.nodeSelector.workload=sandbox" +
		" --set-string 'sandbox.tolerations[0].key=workload' --set-string 'sandbox.tolerations[0].value=sandbox'" +
		" --set-string 'sandbox.tolerations[0].effect=NoSchedule' --set replicaCount=3 --wait --timeout 10m\n"
	if stdout != want {
		t.Errorf("dry run printed\n%s\nwant\n%s", stdout, want)
	}
}

// fakeBin makes a directory holding the basic tools the scripts need before
// their checks, and the fakes given (name → script body).
func fakeBin(t *testing.T, fakes map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for _, tool := range []string{"bash", "dirname", "basename", "cat", "sed", "tr", "head", "tail", "mktemp", "rm", "base64"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(dir, tool)); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range fakes {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/bash\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestScriptsNeedTools(t *testing.T) {
	t.Parallel()
	_, statErr := os.Stat(filepath.Join(moduleRoot(t), "deploy", "images"))
	haveBuilder := statErr == nil
	builderWant := "the image builder (deploy/images) is not in this checkout"
	if haveBuilder {
		// The fake go stands in for the builder: its last line is the digest.
		builderWant = "reg.example/o/orchard-agent@sha256:feed"
	}
	tests := []struct {
		name   string
		script string
		env    []string
		fakes  map[string]string
		args   []string
		want   string
		ok     bool
	}{
		{"provision without az", "deploy/aks/provision-aks.sh", []string{"ACR_NAME=orchardtest"}, nil, nil,
			"missing required tool(s): az", false},
		{"provision logged out", "deploy/aks/provision-aks.sh", []string{"ACR_NAME=orchardtest"},
			map[string]string{"az": "echo 'Please run az login' >&2; exit 1"}, nil,
			"the Azure CLI is not logged in: run 'az login'", false},
		{"provision with a bad ACR name", "deploy/aks/provision-aks.sh", []string{"ACR_NAME=my-acr"}, nil, nil,
			"ACR_NAME must be 5 to 50 letters and digits", false},
		{"provision without a policy engine", "deploy/aks/provision-aks.sh", []string{"ACR_NAME=orchardtest", "NETWORK_POLICY=none"}, nil, nil,
			"NETWORK_POLICY must be azure or calico", false},
		{"build without go", "deploy/aks/build-and-push.sh", []string{"REGISTRY=reg.example/o"}, nil, nil,
			"missing required tool(s): go", false},
		{"build without a registry", "deploy/aks/build-and-push.sh", nil, nil, nil, "set REGISTRY", false},
		{"build an unknown image", "deploy/aks/build-and-push.sh", []string{"REGISTRY=r"}, nil, []string{"orchard-gpu"}, "unknown image orchard-gpu", false},
		{"build with the builder", "deploy/aks/build-and-push.sh", []string{"REGISTRY=reg.example/o", "TAG=v9"},
			map[string]string{"go": `[ "$*" = "run ./deploy/images --push reg.example/o/orchard-agent:v9 orchard-agent" ] || exit 3; echo pushing; echo sha256:feed`},
			[]string{"orchard-agent"}, builderWant, haveBuilder},
		{"deploy without kubectl", "deploy/aks/deploy-orchard.sh", []string{"REGISTRY=reg.example/o"}, nil, nil,
			"missing required tool(s): kubectl", false},
		{"deploy without helm or go", "deploy/aks/deploy-orchard.sh", []string{"REGISTRY=reg.example/o"},
			map[string]string{"kubectl": "exit 0"}, nil, "missing required tool: helm", false},
		{"smoke test without curl", "deploy/aks/test-deployment.sh", []string{"ORCHARD_URL=http://x", "ORCHARD_API_KEY=k", "BROWSER_IMAGE=none"}, nil, nil,
			"missing required tool(s): curl", false},
		{"smoke test without kubectl to find the server", "deploy/aks/test-deployment.sh", nil,
			map[string]string{"curl": "exit 7"}, nil, "missing required tool(s): kubectl", false},
		{"smoke test without kubectl to find the browser image", "deploy/aks/test-deployment.sh", []string{"ORCHARD_URL=http://x", "ORCHARD_API_KEY=k"},
			map[string]string{"curl": "exit 7"}, nil, "no kubectl to read the server's browser image", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(filepath.Join(fakeBin(t, nil), "bash"), append([]string{filepath.Join(moduleRoot(t), tt.script)}, tt.args...)...)
			cmd.Env = append([]string{"HOME=" + t.TempDir(), "PATH=" + fakeBin(t, tt.fakes)}, tt.env...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			switch {
			case tt.ok && err != nil:
				t.Fatalf("%v\n%s", err, out)
			case !tt.ok && !errors.As(err, &ee):
				t.Fatalf("exit %v, want a failure\n%s", err, out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Errorf("output does not say %q:\n%s", tt.want, out)
			}
		})
	}
}
