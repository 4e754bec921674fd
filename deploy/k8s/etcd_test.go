package k8s

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"

	"github.com/ddp-agent/ddp-agent/agent/launch"
)

// flagValue is the value of --name=value among args, or "".
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// TestEtcdStatefulSet: three members behind a headless Service, each named
// in --initial-cluster under the name it advertises; a budget that keeps
// the quorum; and the endpoint list etcd.yaml tells jobs to use is one
// `ddp-agent run --rdzv-backend etcd` takes, naming every member.
func TestEtcdStatefulSet(t *testing.T) {
	ms := loadManifests(t)
	var sts *appsv1.StatefulSet
	for _, s := range all[appsv1.StatefulSet](ms) {
		if s.file == "etcd.yaml" {
			sts = s.obj
		}
	}
	if sts == nil {
		t.Fatal("etcd.yaml has no StatefulSet")
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Fatalf("replicas %d, want 3 (a quorum of two survives losing one)", deref(sts.Spec.Replicas, 1))
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q, want Parallel: a member is ready only with a quorum, so one at a time never starts", sts.Spec.PodManagementPolicy)
	}
	labels := sts.Spec.Template.Labels
	if sts.Spec.Selector == nil || !selects(sts.Spec.Selector.MatchLabels, labels) {
		t.Errorf("selector %v does not select the template's labels %v", sts.Spec.Selector, labels)
	}
	checkEtcdService(t, ms, sts)
	checkEtcdPDB(t, ms, sts)
	peers := etcdPeers(sts)
	checkInitialCluster(t, sts, peers)

	// The endpoints for the agents, as etcd.yaml's comment gives them.
	data, err := os.ReadFile("etcd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#\s+--rdzv-endpoint=(\S+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("etcd.yaml does not say which --rdzv-endpoint to give the agents")
	}
	var want []string
	for _, p := range peers {
		want = append(want, p+"."+sts.Spec.ServiceName+":2379")
	}
	cfg, err := launch.Parse([]string{"--nnodes=3:4", "--rdzv-backend=etcd", "--rdzv-endpoint=" + string(m[1]), "train.py"},
		func(string) string { return "" }, launch.Host{CPUs: 8, GPUs: func() (int, error) { return 0, nil }})
	if err != nil {
		t.Fatalf("ddp-agent run refuses etcd.yaml's endpoints: %v", err)
	}
	if got := cfg.Endpoints(); !cfg.ExternalStore() || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("endpoints %v (external %v), want every member: %v", got, cfg.ExternalStore(), want)
	}
}

// etcdPeers are the StatefulSet's pod names.
func etcdPeers(sts *appsv1.StatefulSet) []string {
	var names []string
	for i := 0; i < int(*sts.Spec.Replicas); i++ {
		names = append(names, fmt.Sprintf("%s-%d", sts.Name, i))
	}
	return names
}

func checkEtcdService(t *testing.T, ms []manifest, sts *appsv1.StatefulSet) {
	t.Helper()
	for _, s := range all[corev1.Service](ms) {
		if s.file != "etcd.yaml" || s.obj.Name != sts.Spec.ServiceName {
			continue
		}
		if s.obj.Spec.ClusterIP != corev1.ClusterIPNone || !s.obj.Spec.PublishNotReadyAddresses {
			t.Errorf("service %s: want headless (clusterIP None) and publishNotReadyAddresses, so peers resolve before a quorum", s.obj.Name)
		}
		if !selects(s.obj.Spec.Selector, sts.Spec.Template.Labels) {
			t.Errorf("service %s does not select the members", s.obj.Name)
		}
		return
	}
	t.Errorf("serviceName %q names no Service in etcd.yaml", sts.Spec.ServiceName)
}

func checkEtcdPDB(t *testing.T, ms []manifest, sts *appsv1.StatefulSet) {
	t.Helper()
	quorum := int(*sts.Spec.Replicas)/2 + 1
	for _, p := range all[policyv1.PodDisruptionBudget](ms) {
		if p.obj.Spec.Selector == nil || !selects(p.obj.Spec.Selector.MatchLabels, sts.Spec.Template.Labels) {
			continue
		}
		if p.obj.Spec.MinAvailable == nil || p.obj.Spec.MinAvailable.IntValue() != quorum {
			t.Errorf("PodDisruptionBudget %s: minAvailable %v, want the quorum, %d", p.obj.Name, p.obj.Spec.MinAvailable, quorum)
		}
		return
	}
	t.Error("no PodDisruptionBudget selects the etcd members")
}

// checkInitialCluster: --initial-cluster names every member at the peer
// URL it advertises (--initial-advertise-peer-urls with its pod name).
func checkInitialCluster(t *testing.T, sts *appsv1.StatefulSet, peers []string) {
	t.Helper()
	if len(sts.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want etcd alone", len(sts.Spec.Template.Spec.Containers))
	}
	c := sts.Spec.Template.Spec.Containers[0]
	got := map[string]string{}
	for _, kv := range strings.Split(flagValue(c.Command, "initial-cluster"), ",") {
		name, url, _ := strings.Cut(kv, "=")
		got[name] = url
	}
	var names []string
	for n := range got {
		names = append(names, n)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != strings.Join(peers, ",") {
		t.Errorf("--initial-cluster names %v, want every member: %v", names, peers)
	}
	for i, p := range peers {
		env, err := containerEnv(c, pod{index: i, name: p})
		if err != nil {
			t.Fatal(err)
		}
		args, err := argv(c, env)
		if err != nil {
			t.Fatal(err)
		}
		if n := flagValue(args, "name"); n != p {
			t.Errorf("member %s calls itself %q", p, n)
		}
		if adv := flagValue(args, "initial-advertise-peer-urls"); adv != got[p] {
			t.Errorf("member %s advertises %q, --initial-cluster has %q", p, adv, got[p])
		}
	}
}
