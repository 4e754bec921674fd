package k8s

import (
	"fmt"
	"net"
	"regexp"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// completionIndexPath is where the Job controller puts a pod's index, and
// the field Kubeflow Trainer's torch plugin reads PET_NODE_RANK from
// (kubeflow/trainer, pkg/constants: JobCompletionIndexFieldPath).
var completionIndexPath = fmt.Sprintf("metadata.annotations['%s']", batchv1.JobCompletionIndexAnnotation)

// found is an object of type T and the manifest it came from.
type found[T any] struct {
	manifest
	obj *T
}

// all returns the manifests' objects of type T.
func all[T any](ms []manifest) []found[T] {
	var out []found[T]
	for _, m := range ms {
		if o, ok := m.obj.(*T); ok {
			out = append(out, found[T]{m, o})
		}
	}
	return out
}

// pod is what a container of a pod of a Job sees: its index and name.
type pod struct {
	index int
	name  string
}

// containerEnv is the container's environment as the kubelet builds it,
// with the downward API and secrets given sample values: each value may use
// $(VAR) of the variables before it.
func containerEnv(c corev1.Container, p pod) (map[string]string, error) {
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			v, err := expand(e.Value, env)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			env[e.Name] = v
			continue
		}
		v, err := sampleValueFrom(e.ValueFrom, p)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		env[e.Name] = v
	}
	return env, nil
}

func sampleValueFrom(src *corev1.EnvVarSource, p pod) (string, error) {
	switch {
	case src.SecretKeyRef != nil:
		return "0123456789abcdef0123456789abcdef", nil // as `openssl rand -hex 16` makes one
	case src.ConfigMapKeyRef != nil:
		return "sample-config", nil
	case src.FieldRef == nil:
		return "", fmt.Errorf("a value source this test has no sample for")
	}
	switch path := src.FieldRef.FieldPath; path {
	case completionIndexPath, fmt.Sprintf("metadata.labels['%s']", batchv1.JobCompletionIndexAnnotation):
		return strconv.Itoa(p.index), nil
	case "metadata.name":
		return p.name, nil
	case "metadata.namespace":
		return "default", nil
	case "status.podIP":
		return "10.0.0." + strconv.Itoa(p.index+1), nil
	case "spec.nodeName":
		return "gpu-node-" + strconv.Itoa(p.index), nil
	default:
		return "", fmt.Errorf("fieldRef %q: no sample value", path)
	}
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand replaces $(VAR) as the kubelet does in env values, command and
// args. A reference to a variable that is not defined is an error here
// (the kubelet would leave it as it is, and the program get "$(VAR)").
func expand(s string, env map[string]string) (string, error) {
	var missing []string
	out := varRef.ReplaceAllStringFunc(s, func(ref string) string {
		name := varRef.FindStringSubmatch(ref)[1]
		v, ok := env[name]
		if !ok {
			missing = append(missing, name)
			return ref
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("%q refers to %v, not defined before it", s, missing)
	}
	return out, nil
}

// argv is the container's command and args, expanded.
func argv(c corev1.Container, env map[string]string) ([]string, error) {
	var out []string
	for _, a := range append(append([]string(nil), c.Command...), c.Args...) {
		v, err := expand(a, env)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// isCommand reports whether the container runs prog with the given
// subcommand ("" for none).
func isCommand(c corev1.Container, prog, sub string) bool {
	cmd := append(append([]string(nil), c.Command...), c.Args...)
	if len(cmd) == 0 || cmd[0] != prog {
		return false
	}
	return sub == "" || (len(cmd) > 1 && cmd[1] == sub)
}

// envVar is the container's variable of that name, or nil.
func envVar(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// portNumber resolves a probe's port, by number or by the container's
// port name.
func portNumber(c corev1.Container, p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.Name, p.StrVal)
}

// addrPort is the port of a listen address such as ":9464".
func addrPort(addr string) (int, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(port)
}

// gpus is the container's nvidia.com/gpu limit (requests follow limits
// for extended resources).
func gpus(c corev1.Container) int {
	q, ok := c.Resources.Limits["nvidia.com/gpu"]
	if !ok {
		return 0
	}
	return int(q.Value())
}

// podLabels are the labels a pod of the Job carries: its template's, and
// those the Job controller adds.
func podLabels(j *batchv1.Job) map[string]string {
	l := map[string]string{batchv1.JobNameLabel: j.Name, "job-name": j.Name}
	for k, v := range j.Spec.Template.Labels {
		l[k] = v
	}
	return l
}

// selects reports whether a non-empty selector matches the labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// effectiveUID is the uid a container runs as: its own securityContext's,
// else the pod's; nil when neither sets one (the image's user).
func effectiveUID(spec corev1.PodSpec, c corev1.Container) *int64 {
	if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		return c.SecurityContext.RunAsUser
	}
	if spec.SecurityContext != nil {
		return spec.SecurityContext.RunAsUser
	}
	return nil
}

// failureAction is what the Job controller does with a failed pod whose
// container exited with code, under the pod conditions given: the first
// rule that matches decides; "" means none does (the failure counts
// against backoffLimit).
func failureAction(p *batchv1.PodFailurePolicy, container string, code int32, conditions ...corev1.PodConditionType) batchv1.PodFailurePolicyAction {
	if p == nil {
		return ""
	}
	for _, r := range p.Rules {
		if r.OnExitCodes != nil && exitCodeMatches(r.OnExitCodes, container, code) {
			return r.Action
		}
		for _, pc := range r.OnPodConditions {
			for _, c := range conditions {
				if pc.Type == c && pc.Status == corev1.ConditionTrue {
					return r.Action
				}
			}
		}
	}
	return ""
}

func exitCodeMatches(req *batchv1.PodFailurePolicyOnExitCodesRequirement, container string, code int32) bool {
	if req.ContainerName != nil && *req.ContainerName != container {
		return false
	}
	in := false
	for _, v := range req.Values {
		in = in || v == code
	}
	if req.Operator == batchv1.PodFailurePolicyOnExitCodesOpNotIn {
		return !in && code != 0
	}
	return in
}

// deref is *p, or def when p is nil.
func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
