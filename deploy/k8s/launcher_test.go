package k8s

import (
	"net"
	"strconv"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ddp-agent/ddp-agent/agent/launch"
)

// agentExitSlack is what the agent needs after --stop-timeout before it
// exits: leaving the rendezvous (its lease revoked, its store member handed
// over) and flushing its exports: seconds, with room to spare.
const agentExitSlack = 15 * time.Second

// TestIndexedJobs: every Job is an Indexed Job whose pods resolve as
// <job>-<index>.<subdomain> through a headless Service that selects them,
// with the PET_* variables as Kubeflow Trainer sets them.
func TestIndexedJobs(t *testing.T) {
	ms := loadManifests(t)
	jobs := all[batchv1.Job](ms)
	if len(jobs) == 0 {
		t.Fatal("no Job in the manifests")
	}
	for _, j := range jobs {
		t.Run(j.obj.Name, func(t *testing.T) {
			spec := j.obj.Spec
			if mode := deref(spec.CompletionMode, batchv1.NonIndexedCompletion); mode != batchv1.IndexedCompletion {
				t.Errorf("completionMode %s, want Indexed", mode)
			}
			if spec.Completions == nil || spec.Parallelism == nil || *spec.Completions != *spec.Parallelism {
				t.Fatalf("completions %d, parallelism %d: want both, equal (every node at once)", deref(spec.Completions, 0), deref(spec.Parallelism, 0))
			}
			if spec.BackoffLimit == nil {
				t.Error("no backoffLimit: the default (6) is left unsaid")
			}
			pod := spec.Template.Spec
			if pod.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("restartPolicy %q, want Never (podFailurePolicy needs it)", pod.RestartPolicy)
			}
			if !deref(pod.ShareProcessNamespace, false) {
				// Else the launcher (ddp-agent, torchrun) is the container's
				// PID 1, which reaps no orphan: the workers' children that
				// outlived them stayed zombies, more with every restart.
				t.Error("shareProcessNamespace not set: the launcher would be PID 1 and reap no orphaned process")
			}
			checkHeadlessService(t, ms, j)
			if failureAction(spec.PodFailurePolicy, "", 143, corev1.DisruptionTarget) != batchv1.PodFailurePolicyActionIgnore {
				t.Error("a pod with the DisruptionTarget condition (evicted, preempted) is not ignored")
			}
			for _, c := range pod.Containers {
				checkKubeflowEnv(t, j.obj, c)
			}
		})
	}
}

// checkHeadlessService: the Job's subdomain names a headless Service of the
// same file that publishes the pods before they are ready and selects them.
func checkHeadlessService(t *testing.T, ms []manifest, j found[batchv1.Job]) {
	t.Helper()
	sub := j.obj.Spec.Template.Spec.Subdomain
	if sub == "" {
		t.Error("no subdomain: the pods get no DNS names")
		return
	}
	for _, s := range all[corev1.Service](ms) {
		if s.file != j.file || s.obj.Name != sub {
			continue
		}
		if s.obj.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("service %s: clusterIP %q, want None (headless: one DNS record per pod)", sub, s.obj.Spec.ClusterIP)
		}
		if !s.obj.Spec.PublishNotReadyAddresses {
			t.Errorf("service %s: publishNotReadyAddresses is off: the names resolve only once pods are Ready, after the rendezvous that needs them", sub)
		}
		if !selects(s.obj.Spec.Selector, podLabels(j.obj)) {
			t.Errorf("service %s: selector %v does not select the Job's pods (labels %v)", sub, s.obj.Spec.Selector, podLabels(j.obj))
		}
		return
	}
	t.Errorf("subdomain %q names no Service in %s", sub, j.file)
}

// checkKubeflowEnv: the PET_* variables Kubeflow Trainer's torch plugin
// sets: PET_NNODES (the number of nodes), PET_NPROC_PER_NODE, PET_NODE_RANK
// (the completion index), PET_MASTER_ADDR (pod 0) and PET_MASTER_PORT.
func checkKubeflowEnv(t *testing.T, j *batchv1.Job, c corev1.Container) {
	t.Helper()
	if envVar(c, "PET_NNODES") == nil {
		return // a container that is not a launcher
	}
	for _, name := range []string{"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"} {
		if envVar(c, name) == nil {
			t.Errorf("container %s: no %s (Kubeflow Trainer sets it)", c.Name, name)
		}
	}
	if v := envVar(c, "PET_NNODES"); v != nil && v.Value != strconv.Itoa(int(*j.Spec.Completions)) {
		t.Errorf("container %s: PET_NNODES %q, want the completions, %d", c.Name, v.Value, *j.Spec.Completions)
	}
	if v := envVar(c, "PET_NODE_RANK"); v != nil && (v.ValueFrom == nil || v.ValueFrom.FieldRef == nil || v.ValueFrom.FieldRef.FieldPath != completionIndexPath) {
		t.Errorf("container %s: PET_NODE_RANK is not from %s", c.Name, completionIndexPath)
	}
	want := j.Name + "-0." + j.Spec.Template.Spec.Subdomain
	if v := envVar(c, "PET_MASTER_ADDR"); v != nil && v.Value != want {
		t.Errorf("container %s: PET_MASTER_ADDR %q, want pod 0's name %q", c.Name, v.Value, want)
	}
	if v := envVar(c, "PET_NPROC_PER_NODE"); v != nil && gpus(c) > 0 && v.Value != strconv.Itoa(gpus(c)) {
		t.Errorf("container %s: PET_NPROC_PER_NODE %q, want one worker per GPU, %d", c.Name, v.Value, gpus(c))
	}
}

// parseAgentRun parses a `ddp-agent run` container's command line with the
// agent's parser, in the environment of the pod of that index.
func parseAgentRun(j *batchv1.Job, c corev1.Container, index int) (*launch.Config, error) {
	env, err := containerEnv(c, pod{index: index, name: j.Name + "-" + strconv.Itoa(index) + "-x7k2p"})
	if err != nil {
		return nil, err
	}
	args, err := argv(c, env)
	if err != nil {
		return nil, err
	}
	host := launch.Host{CPUs: 96, GPUs: func() (int, error) { return gpus(c), nil }}
	return launch.Parse(args[2:], func(k string) string { return env[k] }, host)
}

// TestAgentRunCommands: every `ddp-agent run` command line is accepted by
// the agent's parser, in the environment of every pod of its Job, and the
// Job around it fits what the agent does: the exit codes, the stop
// timeout, the rendezvous address, the health endpoints.
func TestAgentRunCommands(t *testing.T) {
	n := 0
	for _, j := range all[batchv1.Job](loadManifests(t)) {
		for _, c := range j.obj.Spec.Template.Spec.Containers {
			if !isCommand(c, "ddp-agent", "run") {
				continue
			}
			n++
			t.Run(j.obj.Name+"/"+c.Name, func(t *testing.T) {
				var cfg *launch.Config
				for i := 0; i < int(*j.obj.Spec.Completions); i++ {
					got, err := parseAgentRun(j.obj, c, i)
					if err != nil {
						t.Fatalf("pod %d: ddp-agent run refuses its command line: %v", i, err)
					}
					if cfg == nil {
						cfg = got
					}
				}
				checkAgentRun(t, j.obj, c, cfg)
				checkExitCodes(t, j.obj, c)
				checkHealthProbes(t, j.obj, c, cfg)
			})
		}
	}
	if n == 0 {
		t.Error("no `ddp-agent run` container in the manifests")
	}
}

func checkAgentRun(t *testing.T, j *batchv1.Job, c corev1.Container, cfg *launch.Config) {
	t.Helper()
	if cfg.NNodesMax != int(*j.Spec.Completions) {
		t.Errorf("--nnodes max %d, want the Job's completions %d", cfg.NNodesMax, *j.Spec.Completions)
	}
	if g := gpus(c); g > 0 && cfg.NProcPerNode != g {
		t.Errorf("%d workers per node, want one per GPU, %d", cfg.NProcPerNode, g)
	}
	if cfg.Dynamic() && !cfg.ExternalStore() {
		host, _, err := net.SplitHostPort(cfg.Endpoints()[0])
		if want := j.Name + "-0." + j.Spec.Template.Spec.Subdomain; err != nil || host != want {
			t.Errorf("c10d endpoint %v: want pod 0, %s", cfg.Endpoints(), want)
		}
	}
	grace := j.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil {
		t.Fatal("no terminationGracePeriodSeconds (the default, 30s, may not cover --stop-timeout)")
	}
	if g := time.Duration(*grace) * time.Second; g < cfg.StopTimeout+agentExitSlack {
		t.Errorf("terminationGracePeriodSeconds %v: want at least --stop-timeout %v + %v, or the kubelet kills the agent while it stops its workers", g, cfg.StopTimeout, agentExitSlack)
	}
}

// checkExitCodes: the podFailurePolicy acts on the agent's exit codes as
// docs/launcher.md defines them.
func checkExitCodes(t *testing.T, j *batchv1.Job, c corev1.Container) {
	t.Helper()
	p := j.Spec.PodFailurePolicy
	has3 := false
	for _, r := range p.Rules {
		if r.OnExitCodes != nil && exitCodeMatches(r.OnExitCodes, c.Name, 3) {
			has3 = true
		}
	}
	if !has3 {
		t.Error("podFailurePolicy has no rule for exit code 3 (this node left the job)")
	}
	tests := []struct {
		why  string
		code int32
		cond []corev1.PodConditionType
		want batchv1.PodFailurePolicyAction
	}{
		{"3, a node drained (GPU fault, straggler, plugin): the job trains on; replace the pod, uncounted", 3, nil, batchv1.PodFailurePolicyActionIgnore},
		{"1, the job failed for good (restarts spent)", 1, nil, batchv1.PodFailurePolicyActionFailJob},
		{"2, a usage error: every retry fails alike", 2, nil, batchv1.PodFailurePolicyActionFailJob},
		{"143, SIGTERM of an evicted pod", 143, []corev1.PodConditionType{corev1.DisruptionTarget}, batchv1.PodFailurePolicyActionIgnore},
		{"137, killed for memory: counted", 137, nil, ""},
	}
	for _, tc := range tests {
		if got := failureAction(p, c.Name, tc.code, tc.cond...); got != tc.want {
			t.Errorf("exit %s: got action %q, want %q", tc.why, got, tc.want)
		}
	}
}

// checkHealthProbes: liveness on /healthz and readiness on /readyz, on the
// port --metrics-addr serves, which is also the one Prometheus scrapes.
func checkHealthProbes(t *testing.T, j *batchv1.Job, c corev1.Container, cfg *launch.Config) {
	t.Helper()
	if cfg.MetricsAddr == "" {
		t.Fatal("no --metrics-addr: no /healthz, /readyz or /metrics to probe and scrape")
	}
	port, err := addrPort(cfg.MetricsAddr)
	if err != nil {
		t.Fatalf("--metrics-addr %q: %v", cfg.MetricsAddr, err)
	}
	for _, p := range []struct {
		kind, path string
		probe      *corev1.Probe
	}{{"liveness", "/healthz", c.LivenessProbe}, {"readiness", "/readyz", c.ReadinessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no %s httpGet probe", p.kind)
			continue
		}
		got, err := portNumber(c, p.probe.HTTPGet.Port)
		if err != nil || got != port || p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s probe on %s port %v (%d, %v), want %s on --metrics-addr's port %d", p.kind, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port, got, err, p.path, port)
		}
	}
	// The agent serves HTTP only once it reached its store, which it may
	// dial for the whole join timeout: a startup probe must cover that, or
	// the kubelet kills pods waiting for pod 0.
	if sp := c.StartupProbe; sp == nil || sp.HTTPGet == nil || sp.HTTPGet.Path != "/healthz" {
		t.Errorf("no startupProbe on /healthz: liveness would kill a pod still dialing the store")
	} else if wait := time.Duration(sp.PeriodSeconds*sp.FailureThreshold) * time.Second; wait < cfg.Rdzv.JoinTimeout {
		t.Errorf("startupProbe allows %v, less than the join timeout %v", wait, cfg.Rdzv.JoinTimeout)
	}
	ann := j.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(port) {
		t.Errorf("prometheus annotations %v: want scrape \"true\" on port %d", ann, port)
	}
}
