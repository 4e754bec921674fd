package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The comm hook (python/ddp_agent) in real DDP jobs: under ddp-agent, under
// torchrun, and with a worker dying mid-training.

// hookTrainArgs runs examples/train.py on 2 ranks of one node, as the hook
// tests all do; the agent waits 20 s for a worker to stop.
func hookTrainArgs(args ...string) []string {
	return append([]string{"--standalone", "--nproc-per-node", "2", "--stop-timeout", "20s"}, args...)
}

func trainPy() string { return filepath.Join(repoRoot, "examples", "train.py") }

func hookProbe() string { return filepath.Join(repoRoot, "agent", "e2e", "testdata", "hook_probe.py") }

var collectiveEventsRE = regexp.MustCompile(`msg="collective events".*?generation=(\d+).*?received=(\d+).*?dropped=(\d+)`)

// collectiveEvent is one of the agent's `collective events` log lines.
type collectiveEvent struct{ generation, received, dropped int }

func collectiveEvents(stderr string) []collectiveEvent {
	var out []collectiveEvent
	for _, m := range collectiveEventsRE.FindAllStringSubmatch(stderr, -1) {
		g, _ := strconv.Atoi(m[1])
		r, _ := strconv.Atoi(m[2])
		d, _ := strconv.Atoi(m[3])
		out = append(out, collectiveEvent{g, r, d})
	}
	return out
}

var paramDigestRE = regexp.MustCompile(`params rank=(\d+) sha256=([0-9a-f]+)`)

// paramDigests returns rank -> digest from train.py's `params` lines (the last of each rank).
func paramDigests(stdout string) map[int]string {
	out := map[int]string{}
	for _, m := range paramDigestRE.FindAllStringSubmatch(stdout, -1) {
		rank, _ := strconv.Atoi(m[1])
		out[rank] = m[2]
	}
	return out
}

// checkSameDigests fails the test unless ranks 0 and 1, and only they, reported equal parameters.
func checkSameDigests(t *testing.T, stdout, logs string) map[int]string {
	t.Helper()
	d := paramDigests(stdout)
	if len(d) != 2 || d[0] == "" || d[1] == "" || d[0] != d[1] {
		t.Fatalf("params digests %v, want ranks 0 and 1 equal\n%s", d, logs)
	}
	return d
}

// probe is one rank's PROBE record from testdata/hook_probe.py.
type probe struct {
	Rank      int            `json:"rank"`
	WorldSize int            `json:"world_size"`
	SocketEnv bool           `json:"socket_env"`
	Info      map[string]any `json:"info"`
	Digest    string         `json:"digest"`
}

// probes returns rank -> record from hook_probe.py's PROBE records. It
// scans the whole output, not lines: under torchrun 1.13 the ranks share
// one pipe, and another rank's output may follow a record on its line.
func probes(t *testing.T, stdout string) map[int]probe {
	t.Helper()
	out := map[int]probe{}
	for i := strings.Index(stdout, "PROBE "); i >= 0; {
		dec := json.NewDecoder(strings.NewReader(stdout[i+len("PROBE "):]))
		var p probe
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("PROBE record at byte %d: %v\n%s", i, err, stdout)
		}
		out[p.Rank] = p
		end := i + len("PROBE ") + int(dec.InputOffset())
		next := strings.Index(stdout[end:], "PROBE ")
		if next < 0 {
			break
		}
		i = end + next
	}
	return out
}

// checkProbes fails the test unless both ranks reported and ended with the same parameters.
func checkProbes(t *testing.T, stdout, logs string) map[int]probe {
	t.Helper()
	p := probes(t, stdout)
	if _, ok := p[0]; !ok || len(p) != 2 {
		t.Fatalf("probes from ranks %v, want 0 and 1\n%s", keys(p), logs)
	}
	if _, ok := p[1]; !ok {
		t.Fatalf("probes from ranks %v, want 0 and 1\n%s", keys(p), logs)
	}
	if p[0].Digest != p[1].Digest {
		t.Fatalf("rank 0 digest %s, rank 1 %s: want equal\n%s", p[0].Digest, p[1].Digest, logs)
	}
	return p
}

func keys(p map[int]probe) []int {
	var ks []int
	for k := range p {
		ks = append(ks, k)
	}
	return ks
}

// num reads a JSON number of a probe's info as an int (0 if absent).
func num(info map[string]any, key string) int {
	f, _ := info[key].(float64)
	return int(f)
}

// TestHookTrainUnderAgent: train.py with the hook under ddp-agent
// succeeds, the ranks agree, and the agent receives the events. With 2
// ranks, averaging is exact in either order ((a+b)/2 == a/2+b/2 in floating
// point), so the hook must also end bit-identical to DDP's built-in gloo
// all-reduce.
func TestHookTrainUnderAgent(t *testing.T) {
	budget(t, 15*time.Second)
	needTorch(t)
	digests := map[string]string{}
	for _, mode := range []string{"ddp-agent", "none"} {
		r := startAgent(t, nil, hookTrainArgs(trainPy(), "--steps", "8", "--log-every", "4",
			"--ckpt-dir", filepath.Join(t.TempDir(), mode), "--comm-hook", mode)...)
		if code := r.wait(120 * time.Second); code != 0 {
			t.Fatalf("%s: exit code %d, want 0\n%s", mode, code, r.logs())
		}
		out := r.stdout.String()
		if !strings.Contains(out, "[rank0]:done: steps=8") {
			t.Fatalf("%s: stdout lacks the end of training\n%s", mode, r.logs())
		}
		stepTime := regexp.MustCompile(`\[rank0\]:step_time comm_hook=` + regexp.QuoteMeta(mode) + ` steps=3 warmup=5 mean_ms=`)
		if !stepTime.MatchString(out) {
			t.Fatalf("%s: stdout lacks %s\n%s", mode, stepTime, r.logs())
		}
		digests[mode] = checkSameDigests(t, out, r.logs())[0]
		if mode == "none" {
			if strings.Contains(out, "comm hook: ddp-agent") {
				t.Fatalf("the hook was registered with --comm-hook none\n%s", r.logs())
			}
			continue
		}
		if !strings.Contains(out, "[rank0]:comm hook: ddp-agent") {
			t.Fatalf("stdout lacks the hook's registration\n%s", r.logs())
		}
		events := collectiveEvents(r.stderr.String())
		if len(events) == 0 {
			t.Fatalf("no `collective events` line\n%s", r.logs())
		}
		if last := events[len(events)-1]; last.generation != 0 || last.received <= 0 {
			t.Fatalf("last collective events %+v, want generation 0 with events received\n%s", last, r.logs())
		}
	}
	if digests["ddp-agent"] != digests["none"] {
		t.Fatalf("params with the hook %s, with DDP's all-reduce %s: want equal", digests["ddp-agent"], digests["none"])
	}
}

// TestHookBootstrapsThroughAgent: under ddp-agent the hook's communicator
// is connected to the control socket and ships events.
func TestHookBootstrapsThroughAgent(t *testing.T) {
	budget(t, 10*time.Second)
	needTorch(t)
	r := startAgent(t, nil, hookTrainArgs(hookProbe(), "6")...)
	if code := r.wait(90 * time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
	}
	for rank, p := range checkProbes(t, r.stdout.String(), r.logs()) {
		info := p.Info
		switch {
		case !p.SocketEnv:
			t.Errorf("rank %d: DDP_AGENT_SOCKET not set: %+v", rank, p)
		case info["agent"] != true:
			t.Errorf("rank %d: got agent %v, want true: %v", rank, info["agent"], info)
		case num(info, "rank") != rank || num(info, "world_size") != 2:
			t.Errorf("rank %d: got rank %v of %v, want %d of 2: %v", rank, info["rank"], info["world_size"], rank, info)
		case info["transport"] != "shm" && info["transport"] != "tcp":
			t.Errorf("rank %d: got transport %v, want shm or tcp: %v", rank, info["transport"], info)
		case num(info, "collectives") <= 0 || num(info, "events_sent") <= 0:
			t.Errorf("rank %d: got %v collectives and %v events sent, want some of each: %v", rank, info["collectives"], info["events_sent"], info)
		}
	}
	events := collectiveEvents(r.stderr.String())
	if len(events) == 0 || events[len(events)-1].received <= 0 {
		t.Fatalf("collective events %+v, want the last with events received\n%s", events, r.logs())
	}
}

// TestHookNCCLUniqueIDThroughAgent: transport "nccl" under ddp-agent, on the
// fake NCCL: rank 0's unique id reaches rank 1 through the agent's KV.
func TestHookNCCLUniqueIDThroughAgent(t *testing.T) {
	budget(t, 10*time.Second)
	needTorch(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc builds the fake NCCL")
	}
	lib := filepath.Join(t.TempDir(), "libnccl.so.2")
	src := filepath.Join(repoRoot, "shim", "nccl", "testdata", "fakenccl.c")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-pthread", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc fakenccl.c: %v\n%s", err, out)
	}
	fakeDir, err := os.MkdirTemp("/tmp", "fakenccl-") // short: the unique id holds the path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(fakeDir) })
	// LD_PRELOAD: PyTorch 2.x from PyPI loads its own libnccl.so.2 on import,
	// and the shim takes an NCCL already in the process before
	// DDP_AGENT_NCCL_LIB; preloaded, the fake is the one in the process (and
	// the one found on torch 1.13, which brings none).
	env := []string{"PROBE_TRANSPORT=nccl", "DDP_AGENT_NCCL_LIB=" + lib, "LD_PRELOAD=" + lib,
		"FAKE_NCCL_DIR=" + fakeDir, "FAKE_NCCL_VERSION=22005"}
	r := startAgent(t, env, hookTrainArgs(hookProbe(), "4")...)
	if code := r.wait(90 * time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
	}
	for rank, p := range checkProbes(t, r.stdout.String(), r.logs()) {
		info := p.Info
		nccl, _ := info["nccl"].(map[string]any)
		switch {
		case info["transport"] != "nccl" || info["connected"] != true:
			t.Errorf("rank %d: got transport %v connected %v, want a connected nccl: %v", rank, info["transport"], info["connected"], info)
		case info["agent"] != true || nccl["version"] != "2.20.5":
			t.Errorf("rank %d: got agent %v, NCCL %v, want the agent's and 2.20.5: %v", rank, info["agent"], nccl["version"], info)
		case num(info, "collectives") <= 0:
			t.Errorf("rank %d: got no collectives: %v", rank, info)
		}
	}
}

// TestHookTrainUnderTorchrun: under torchrun (no agent) the hook bootstraps
// through torch's store; the ranks end bit-identical. torchrun runs through
// scripts/torchrun_compat.py (DDP_AGENT_TORCHRUN_COMPAT overrides it).
func TestHookTrainUnderTorchrun(t *testing.T) {
	budget(t, 15*time.Second)
	needTorch(t)
	compat := torchrunCompat(t)
	// TMPDIR of its own: no sidecar socket can be at the default path.
	env := []string{"DDP_AGENT_SHIM=" + shimLib, "TMPDIR=" + t.TempDir()}
	torchrun := func(args ...string) []string {
		return append([]string{python, compat, "--standalone", "--nproc_per_node", "2"}, args...)
	}
	r := runProc(t, 150*time.Second, env, "", torchrun(trainPy(), "--steps", "8", "--log-every", "4",
		"--ckpt-dir", t.TempDir(), "--comm-hook", "ddp-agent")...)
	if r.code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", r.code, r.logs())
	}
	if !strings.Contains(r.stdout, "comm hook: ddp-agent") || !strings.Contains(r.stdout, "done: steps=8") {
		t.Fatalf("stdout lacks the hook's registration or the end of training\n%s", r.logs())
	}
	checkSameDigests(t, r.stdout, r.logs())

	r = runProc(t, 120*time.Second, env, "", torchrun(hookProbe(), "6")...)
	if r.code != 0 {
		t.Fatalf("probe: exit code %d, want 0\n%s", r.code, r.logs())
	}
	for rank, p := range checkProbes(t, r.stdout, r.logs()) {
		if p.SocketEnv || p.Info["agent"] != false {
			t.Errorf("rank %d: got socket_env %v agent %v, want neither under torchrun: %+v", rank, p.SocketEnv, p.Info["agent"], p)
		}
		if _, ok := p.Info["sidecar"]; ok {
			t.Errorf("rank %d: the communicator tried a sidecar where there is none: %+v", rank, p.Info)
		}
		if num(p.Info, "collectives") <= 0 {
			t.Errorf("rank %d: got no collectives: %+v", rank, p)
		}
	}
}

// torchrunCompat returns the torchrun wrapper, failing the test when it is missing.
func torchrunCompat(t *testing.T) string {
	t.Helper()
	compat := os.Getenv("DDP_AGENT_TORCHRUN_COMPAT")
	if compat == "" {
		compat = filepath.Join(repoRoot, "scripts", "torchrun_compat.py")
	}
	if _, err := os.Stat(compat); err != nil {
		t.Fatalf("torchrun wrapper: %v (scripts/torchrun_compat.py, or DDP_AGENT_TORCHRUN_COMPAT)", err)
	}
	return compat
}
