package kube

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/harness"
	"github.com/orchard/orchard/runtime"
)

const (
	containerName = "sandbox"
	initName      = "orchard-agent"
	volumeName    = "orchard-agent"
)

// reference is the grammar of an image reference (the distribution
// project's): checked before a pod exists, so that a malformed one is a
// classified client error instead of a pod stuck in InvalidImageName.
var reference = regexp.MustCompile(`^(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?/)?` +
	`[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*` +
	`(?::[\w][\w.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$`)

// image returns the image a spec's sandbox runs.
func (r *Runtime) image(spec runtime.Spec) (string, error) {
	img := spec.Image
	if img == "" {
		img = r.cfg.Images[kindOr(spec.Kind)]
	}
	switch {
	case img == "":
		return "", faults.Newf(faults.CodeImageRef, faults.InvalidRequest, faults.Client,
			"no image given, and the server has no default image for %s sandboxes", kindOr(spec.Kind))
	case img == "host", strings.HasPrefix(img, "oci-layout:"), strings.HasPrefix(img, "docker-archive:"):
		return "", faults.Newf(faults.CodeImageRef, faults.InvalidRequest, faults.Client,
			"image %q is a local image; on Kubernetes a sandbox runs an image from a registry", img)
	case !reference.MatchString(img):
		return "", faults.Newf(faults.CodeImageRef, faults.InvalidRequest, faults.Client, "image %q is not a valid reference", img)
	}
	return img, nil
}

func kindOr(k string) string {
	if k == "" {
		return "shell"
	}
	return k
}

// podFor is the pod of a sandbox.
func (r *Runtime) podFor(spec runtime.Spec) (*corev1.Pod, error) {
	if errs := validation.IsDNS1123Label(podName(spec.ID)); len(errs) > 0 {
		return nil, faults.Newf(faults.CodeCreateFailed, faults.InvalidRequest, faults.Client,
			"sandbox id %q cannot name a pod: %s", spec.ID, strings.Join(errs, "; "))
	}
	img, err := r.image(spec)
	if err != nil {
		return nil, err
	}
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("kube runtime: encode spec: %w", err)
	}
	res, err := resources(spec)
	if err != nil {
		return nil, err
	}
	lbl := map[string]string{}
	// The user's labels go on the pod where Kubernetes accepts them (all
	// of them are in the spec annotation either way).
	for k, v := range spec.Labels {
		if len(validation.IsQualifiedName(k)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			lbl[k] = v
		}
	}
	lbl[LabelManagedBy] = ManagedBy
	lbl[LabelSandbox] = spec.ID
	lbl[LabelKind] = kindOr(spec.Kind)

	port := int32(r.cfg.AgentPort)
	var deadline *int64
	ttl := int64(spec.TTLSeconds)
	if ttl <= 0 {
		ttl = int64(r.cfg.DefaultTTL.Seconds())
	}
	if ttl > 0 {
		d := ttl + int64(r.cfg.TTLGrace.Seconds())
		deadline = &d
	}
	grace := int64(r.cfg.DeleteGrace.Seconds())
	no := false
	var pullSecrets []corev1.LocalObjectReference
	for _, s := range r.cfg.ImagePullSecrets {
		pullSecrets = append(pullSecrets, corev1.LocalObjectReference{Name: s})
	}
	volumes := []corev1.Volume{{Name: volumeName,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mounts := []corev1.VolumeMount{{Name: volumeName, MountPath: agentDir, ReadOnly: true}}
	extraEnv := spec.Env
	if len(spec.Harnesses) > 0 {
		if r.cfg.HarnessImage == "" {
			return nil, faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "this server has no harness image")
		}
		// An image volume: the node pulls the image once and every pod
		// on it mounts the same read-only copy.
		volumes = append(volumes, corev1.Volume{Name: harnessVolume, VolumeSource: corev1.VolumeSource{
			Image: &corev1.ImageVolumeSource{Reference: r.cfg.HarnessImage, PullPolicy: r.cfg.PullPolicy}}})
		mounts = append(mounts, corev1.VolumeMount{Name: harnessVolume, MountPath: harness.MountPath, ReadOnly: true})
		extraEnv = maps.Clone(spec.Env)
		if extraEnv == nil {
			extraEnv = map[string]string{}
		}
		extraEnv[harness.PathEnv] = harness.SearchPath(spec.Harnesses)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        podName(spec.ID),
			Namespace:   r.cfg.Namespace,
			Labels:      lbl,
			Annotations: map[string]string{AnnotationSpec: string(specJSON)},
		},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			// Sandboxes get no credentials for the API server, and no
			// environment naming the cluster's services.
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			ActiveDeadlineSeconds:         deadline,
			TerminationGracePeriodSeconds: &grace,
			NodeSelector:                  r.cfg.NodeSelector,
			Tolerations:                   r.cfg.Tolerations,
			ImagePullSecrets:              pullSecrets,
			Volumes:                       volumes,
			InitContainers: []corev1.Container{{
				Name:            initName,
				Image:           r.cfg.AgentImage,
				ImagePullPolicy: r.cfg.PullPolicy,
				Command:         []string{"/orchard-agent", "install", agentPath},
				VolumeMounts:    []corev1.VolumeMount{{Name: volumeName, MountPath: agentDir}},
			}},
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           img,
				ImagePullPolicy: r.cfg.PullPolicy,
				Command:         r.agentArgs(spec),
				Env:             env(extraEnv, r.cfg.WorkingDir),
				WorkingDir:      r.cfg.WorkingDir,
				Resources:       res,
				Ports:           []corev1.ContainerPort{{Name: "agent", ContainerPort: port}},
				VolumeMounts:    mounts,
				// Ready is the agent answering: Create waits for it on the
				// informer, without calling the agent itself.
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(port)}},
					PeriodSeconds:    1,
					FailureThreshold: 1,
					TimeoutSeconds:   2,
				},
			}},
		},
	}, nil
}

var _ runtime.HarnessLister = (*Runtime)(nil)

// harnessVolume is the volume of the harness image.
const harnessVolume = "orchard-harnesses"

// Harnesses lists the harnesses of the harness image (Config.Harnesses).
func (r *Runtime) Harnesses() ([]string, error) {
	if r.cfg.HarnessImage == "" {
		return nil, nil
	}
	return r.cfg.Harnesses, nil
}

// agentArgs is the sandbox container's command: the agent, serving the
// pod's network with the sandbox's token, running the sandbox's kind.
func (r *Runtime) agentArgs(spec runtime.Spec) []string {
	args := []string{agentPath, "--listen", ":" + strconv.Itoa(r.cfg.AgentPort), "--token-sha256", tokenHash(r.token(spec.ID))}
	if spec.Kind != "" {
		args = append(args, "--kind", spec.Kind)
	}
	if len(spec.KindOptions) > 0 {
		args = append(args, "--kind-options", string(spec.KindOptions))
	}
	if !spec.BlockNetwork && spec.NetworkMode != runtime.NetworkFull {
		// The namespace's policy denies the pod every egress: the proxy
		// hands each connection to the server through the tunnel the
		// server attaches, as on the local runtime.
		args = append(args, "--egress-proxy", "127.0.0.1:3128")
	}
	if len(spec.Faults) > 0 {
		args = append(args, "--faults", string(spec.Faults))
	}
	return args
}

// env is the sandbox container's environment, sorted for a stable spec.
func env(extra map[string]string, workdir string) []corev1.EnvVar {
	m := map[string]string{"WORKING_DIR": workdir}
	for k, v := range extra {
		m[k] = v
	}
	out := make([]corev1.EnvVar, 0, len(m))
	for k, v := range m {
		out = append(out, corev1.EnvVar{Name: k, Value: v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// resources turns the spec's limits into requests equal to limits: a
// sandbox is guaranteed the cpu and memory it may use.
func resources(spec runtime.Spec) (corev1.ResourceRequirements, error) {
	q := corev1.ResourceList{}
	if spec.CPU > 0 {
		q[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(spec.CPU*1000+0.5), resource.DecimalSI)
	}
	if spec.MemoryBytes > 0 {
		q[corev1.ResourceMemory] = *resource.NewQuantity(spec.MemoryBytes, resource.BinarySI)
	}
	if len(q) == 0 && spec.EphemeralStorageBytes == 0 {
		return corev1.ResourceRequirements{}, nil
	}
	req := q.DeepCopy()
	if spec.EphemeralStorageBytes > 0 {
		// A cap, as on the local runtime: the kubelet evicts a sandbox
		// that writes more. Nothing is reserved (a request of 0, which
		// Kubernetes would otherwise set to the limit): every sandbox
		// gets the default cap, and few fill it.
		q[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(spec.EphemeralStorageBytes, resource.BinarySI)
		req[corev1.ResourceEphemeralStorage] = resource.MustParse("0")
	}
	return corev1.ResourceRequirements{Requests: req, Limits: q}, nil
}

// specOf reads the spec a pod was created with.
func specOf(pod *corev1.Pod) (runtime.Spec, bool) {
	raw, ok := pod.Annotations[AnnotationSpec]
	if !ok {
		return runtime.Spec{}, false
	}
	var sp runtime.Spec
	if json.Unmarshal([]byte(raw), &sp) != nil || sp.ID == "" {
		return runtime.Spec{}, false
	}
	return sp, true
}
