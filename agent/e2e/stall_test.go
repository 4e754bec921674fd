package e2e

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/otlptest"
)

// TestHangReportedWithStackAndRestarted: rank 1 sleeps before its backward
// in step 6 (hook step 5) on the first attempt while rank 0 waits in the
// all-reduce. The agent reports the hang after --hang-timeout, naming rank
// 1 as the rank that never arrived with its Python stack (the sleep in
// train.py), aborts, restarts, and the job finishes.
func TestHangReportedWithStackAndRestarted(t *testing.T) {
	budgetAlongside(t, 90*time.Second)
	needTorch(t)
	ckpt := t.TempDir()
	const hangTimeout = 4 * time.Second
	hook := newHookServer(t, 0, http.StatusOK) // a notifier hears the hang, with the stacks
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", hangTimeout.String(),
		"--log-dir", t.TempDir(), "--plugin", "webhook,url="+hook.URL, filepath.Join(repoRoot, "examples", "train.py"), "--steps", "10", "--ckpt-every", "3", "--log-every", "5", "--ckpt-dir", ckpt,
		"--batch-size", "4", "--hang-rank", "1", "--hang-at-step", "6")
	if code := r.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
	}
	all := r.stdout.String() + r.stderr.String()
	hungAt := regexp.MustCompile(`(?m)^.*rank 1 hangs at step 6.*$`)
	if !hungAt.MatchString(all) {
		t.Fatalf("rank 1 did not hang\n%s", r.logs())
	}
	report := regexp.MustCompile(`hang: step 5 bucket \d+ \(generation 0\) has not finished ([0-9.]+) s after the first rank arrived; waiting: rank 0; never arrived: rank 1 \([^)]*pid \d+\)`)
	m := report.FindStringSubmatch(all)
	if m == nil {
		t.Fatalf("no hang report naming rank 1\n%s", r.logs())
	}
	for _, want := range []string{
		"Python stack of rank 1:", // faulthandler's dump, through SIGUSR2
		"train.py", "in main",
		"resumed from step 3", "restart_count 1", "[rank0]:done: steps=10",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("output lacks %q\n%s", want, r.logs())
		}
	}
	// The record names a file with the whole report, kept in the log dir.
	if f := regexp.MustCompile(`stacks_file=(\S+)`).FindStringSubmatch(all); f == nil {
		t.Errorf("the hang's record names no stacks file\n%s", r.logs())
	} else if b, err := os.ReadFile(f[1]); err != nil || !strings.Contains(string(b), "never arrived: rank 1") || !strings.Contains(string(b), "\nPython stack of rank 1:\n") {
		t.Errorf("stacks file %s: %v\n%s", f[1], err, b)
	}
	var waited float64
	if _, err := fmt.Sscan(m[1], &waited); err != nil || waited < hangTimeout.Seconds() || waited > hangTimeout.Seconds()+5 {
		t.Errorf("reported after %s s, want within the timeout %v plus 5 s", m[1], hangTimeout)
	}
	if got := strings.Join(hook.kinds(), " "); got != "job_started hang restarted job_finished" {
		t.Errorf("the webhook heard %q, want job_started hang restarted job_finished", got)
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	for _, ev := range hook.events {
		details, _ := ev["details"].(map[string]any)
		if ev["kind"] == "hang" && (details["missing"] != "1" || !strings.Contains(fmt.Sprint(details["report"]), "Python stack of rank 1:")) {
			t.Errorf("hang event %v: want rank 1 missing and its stack", ev)
		}
		// The job ended in the restarted attempt, generation 1.
		if ev["kind"] == "job_finished" && (fmt.Sprint(ev["attempt"]) != "1" || fmt.Sprint(ev["generation"]) != "1") {
			t.Errorf("job_finished event %v: want attempt 1, generation 1", ev)
		}
	}
}

// TestHangBeforeFirstAllReduce: rank 1 sleeps before its first backward
// (train.py's step 1), so it never opens its communicator, and rank 0
// waits in the bootstrap of its first bucket. That wait is a hang as at
// any later step: reported after --hang-timeout, naming rank 1 with its
// Python stack (the training loop's thread first), and the job restarts
// and finishes. Before, nothing was said until the shim's own bootstrap
// timeout (10 min) failed rank 0, which the root cause then blamed.
func TestHangBeforeFirstAllReduce(t *testing.T) {
	budgetAlongside(t, 60*time.Second)
	needTorch(t)
	logDir := t.TempDir()
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "4s",
		"--log-dir", logDir, filepath.Join(repoRoot, "examples", "train.py"), "--steps", "6", "--ckpt-every", "0",
		"--ckpt-dir", t.TempDir(), "--batch-size", "4", "--hang-rank", "1", "--hang-at-step", "1")
	if code := r.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
	}
	all := r.stdout.String() + r.stderr.String()
	report := regexp.MustCompile(`hang: step 0 bucket 0 \(generation 0\) has not finished [0-9.]+ s after the first rank arrived; waiting: rank 0; never arrived: rank 1 \([^)]*pid \d+\)`)
	if !report.MatchString(all) {
		t.Fatalf("no hang report naming rank 1 at the first bucket\n%s", r.logs())
	}
	f := regexp.MustCompile(`stacks_file=(\S+)`).FindStringSubmatch(all)
	if f == nil {
		t.Fatalf("the hang's record names no stacks file\n%s", r.logs())
	}
	b, err := os.ReadFile(f[1])
	if err != nil {
		t.Fatal(err)
	}
	_, stack, _ := strings.Cut(string(b), "\nPython stack of rank 1:\n")
	if first, _, _ := strings.Cut(stack, "\n\n"); !strings.Contains(first, "train.py") || !strings.HasSuffix(strings.TrimSpace(first), "in <module>") {
		t.Errorf("rank 1's stack does not start with the training loop's thread:\n%s", b)
	}
	for _, want := range []string{"restart_count 1", "[rank0]:done: steps=6"} {
		if !strings.Contains(all, want) {
			t.Errorf("output lacks %q\n%s", want, r.logs())
		}
	}
}

// TestStallNamesStraggler: rank 1 is a second late before its
// backward in steps 14-16 (after the buckets have a history); the agent logs a stall naming rank 1 for those
// steps only, and writes a Perfetto trace file with the collectives.
func TestStallNamesStraggler(t *testing.T) {
	budgetAlongside(t, 60*time.Second)
	needTorch(t)
	logDir := t.TempDir()
	ep := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	r := startAgent(t, nil, "--rdzv-backend", "c10d", "--rdzv-endpoint", ep, "--nproc-per-node", "2", "--log-dir", logDir,
		"--rdzv-id", "stalls", "--trace-sample", "1",
		filepath.Join(repoRoot, "examples", "train.py"), "--steps", "40", "--ckpt-every", "0", "--log-every", "10",
		"--ckpt-dir", t.TempDir(), "--batch-size", "4", "--slow-rank", "1", "--slow-steps", "14,15,16", "--slow-seconds", "1",
		"--sleep-per-step", "0.1")
	// While the job runs, `ddp-agent status` lists the stalls.
	waitFor(t, 2*time.Minute, func() bool {
		return strings.Contains(r.stderr.String(), "stall: step 14 ")
	}, r.logs)
	var st string
	waitFor(t, 10*time.Second, func() bool {
		st = agentOutput(t, "status", "--rdzv-endpoint", ep)
		return strings.Contains(st, "stall: step 14 ")
	}, func() string { return st + "\n" + r.logs() })
	if !strings.Contains(st, "STALLS\n") || !strings.Contains(st, "stall: step 13 bucket") || !strings.Contains(st, "arrived") {
		t.Errorf("status lacks the stalls:\n%s", st)
	}
	if code := r.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
	}
	all := r.stderr.String()
	// On a loaded 2-core machine a rank can be a couple of hundred
	// milliseconds late on its own, and that is a stall too; the injected
	// second is told apart by its size.
	stall := regexp.MustCompile(`stall: step (\d+) bucket \d+: rank (\d+) \([^)]*\) arrived ([0-9.]+)( s|ms) after the others; 1 rank waited`)
	steps := map[string]bool{}
	for _, m := range stall.FindAllStringSubmatch(all, -1) {
		late, _ := strconv.ParseFloat(m[3], 64)
		if m[4] == " s" {
			late *= 1000
		}
		if late < 500 {
			continue
		}
		if m[2] != "1" {
			t.Errorf("stall blames rank %s: %s", m[2], m[0])
		}
		steps[m[1]] = true
	}
	// Hook steps count from 0: train.py's steps 14-16 are hook steps 13-15.
	for _, s := range []string{"13", "14", "15"} {
		if !steps[s] {
			t.Errorf("no stall reported in step %s (got %v)\n%s", s, steps, r.logs())
		}
	}
	if len(steps) != 3 {
		t.Errorf("one-second stalls in steps %v, want exactly 13, 14, 15\n%s", steps, r.logs())
	}
	b, err := os.ReadFile(filepath.Join(logDir, "stalls", "trace-gen0.json"))
	if err != nil {
		t.Fatal(err)
	}
	var events []map[string]any
	if err := json.Unmarshal(b, &events); err != nil {
		t.Fatalf("trace file is not JSON: %v\n%.500s", err, b)
	}
	complete := 0
	for _, ev := range events {
		if ev["ph"] == "X" {
			complete++
		}
	}
	if complete < 2*40 {
		t.Errorf("%d complete events in the trace, want at least one per rank and step", complete)
	}
}

// TestTracesOverOTLP: the same straggler with --otel-endpoint pointing at
// a real OTLP/gRPC receiver: the spans of a stalled step share one trace
// id (the one derived from job, run, generation and step), a "stall: rank 1"
// span names the straggler in steps 13-15 and in no other, and the
// all-reduce spans carry their attributes.
func TestTracesOverOTLP(t *testing.T) {
	budgetAlongside(t, 60*time.Second)
	needTorch(t)
	rcv := otlptest.Start(t)
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "2", "--rdzv-id", "otlp", "--trace-sample", "0",
		"--otel-endpoint", rcv.Addr(),
		filepath.Join(repoRoot, "examples", "train.py"), "--steps", "20", "--ckpt-every", "0", "--log-every", "10",
		"--ckpt-dir", t.TempDir(), "--batch-size", "4", "--slow-rank", "1", "--slow-steps", "14,15,16", "--slow-seconds", "1")
	if code := r.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
	}
	spans := rcv.Spans() // the agent flushed them at exit
	run := runOf(t, r.stderr.String())
	stalled := map[uint64]bool{} // steps with any stall: --trace-sample 0 keeps exactly these
	injected := map[uint64]bool{}
	traces := map[string]uint64{} // trace id -> step
	for _, sp := range spans {
		step, _ := sp.Attr("ddp.step").(int64)
		if sp.Name == "stall" {
			stalled[uint64(step)] = true
			// A loaded machine makes small stalls of its own (see
			// TestStallNamesStraggler); the injected ones are a second.
			if late, _ := sp.Attr("ddp.stall.late").(float64); late >= 0.5 {
				if sp.Attr("ddp.straggler.rank") != int64(1) || sp.Resource["service.name"] != "ddp-agent rank 1" {
					t.Errorf("stall span of rank %v on %v, want rank 1", sp.Attr("ddp.straggler.rank"), sp.Resource["service.name"])
				}
				injected[uint64(step)] = true
			}
		}
		if sp.Attr("ddp.step") != nil {
			want := export.TraceID(export.TraceJob("otlp", run), 0, uint64(step))
			if got := sp.TraceIDHex(); got != hex.EncodeToString(want[:]) {
				t.Errorf("span %q of step %d has trace id %s, want %x", sp.Name, step, got, want)
			}
			traces[sp.TraceIDHex()] = uint64(step)
		}
		if sp.Name == "allreduce" {
			for _, k := range []string{"ddp.rank", "ddp.bucket", "ddp.bytes", "ddp.dtype", "ddp.wait", "ddp.allreduce.busbw", "host.name"} {
				if sp.Attr(k) == nil {
					t.Errorf("span %q lacks %s", sp.Name, k)
				}
			}
			if want := fmt.Sprint("ddp-agent rank ", sp.Attr("ddp.rank")); sp.Resource["service.name"] != want {
				t.Errorf("allreduce span on %v, want %s", sp.Resource["service.name"], want)
			}
		}
	}
	if len(injected) != 3 || !injected[13] || !injected[14] || !injected[15] {
		t.Errorf("one-second stall spans in steps %v, want 13, 14 and 15\n%s", injected, r.logs())
	}
	// --trace-sample 0 keeps only the stalled steps.
	for _, step := range traces {
		if !stalled[step] {
			t.Errorf("step %d exported although only stalled steps are kept", step)
		}
	}
}

// TestStallsAcrossNodes: 2 agents × 2 workers. Rank 3 (on the second
// node) is a second late in train.py's steps 14-16: the leader, which
// gets the other node's records with its clock corrected, names rank 3 as
// the straggler that 3 ranks waited for, and the traces it exports put all
// four ranks' spans of a step in one trace.
func TestStallsAcrossNodes(t *testing.T) {
	budgetAlongside(t, 90*time.Second)
	needTorch(t)
	rcv := otlptest.Start(t)
	j := newJob(t, "2", 0, 20, "--batch-size", "4", "--slow-rank", "3", "--slow-steps", "14,15,16", "--slow-seconds", "1")
	j.args = append(j.args, "--otel-endpoint", rcv.Addr(), "--trace-sample", "0")
	a := j.startHost()
	b := j.start()
	for _, r := range []*agentRun{a, b} {
		if code := r.wait(3 * time.Minute); code != 0 {
			t.Fatalf("exit code %d\n%s\n%s", code, a.logs(), b.logs())
		}
	}
	logs := a.stderr.String() + b.stderr.String()
	stall := regexp.MustCompile(`stall: step (\d+) bucket \d+: rank (\d+) \([^)]*\) arrived ([0-9.]+)( s|ms) after the others; 3 ranks waited`)
	steps := map[string]bool{}
	for _, m := range stall.FindAllStringSubmatch(logs, -1) {
		late, _ := strconv.ParseFloat(m[3], 64)
		if m[4] == " s" {
			late *= 1000
		}
		if late < 500 {
			continue // load noise
		}
		if m[2] != "3" {
			t.Errorf("stall blames rank %s: %s", m[2], m[0])
		}
		steps[m[1]] = true
	}
	for _, l := range regexp.MustCompile(`.*stall: .*`).FindAllString(logs, -1) {
		t.Log(l)
	}
	if len(steps) != 3 || !steps["13"] || !steps["14"] || !steps["15"] {
		t.Errorf("one-second stalls across nodes in steps %v, want 13, 14, 15\n%s\n%s", steps, a.logs(), b.logs())
	}
	// The agents agree on the run, which the trace ids derive from.
	run := runOf(t, a.stderr.String())
	if other := runOf(t, b.stderr.String()); other != run {
		t.Errorf("the agents' runs differ: %s and %s", run, other)
	}
	ranksInStep := map[int64]map[int64]bool{}
	injected := map[int64]bool{}
	for _, sp := range rcv.Spans() {
		if sp.Name == "stall" {
			if late, _ := sp.Attr("ddp.stall.late").(float64); late >= 0.5 {
				step, _ := sp.Attr("ddp.step").(int64)
				if sp.Attr("ddp.straggler.rank") != int64(3) || sp.Resource["service.name"] != "ddp-agent rank 3" {
					t.Errorf("step %d: stall span of rank %v on %v, want rank 3", step, sp.Attr("ddp.straggler.rank"), sp.Resource["service.name"])
				}
				injected[step] = true
			}
		}
		if sp.Name != "allreduce" {
			continue
		}
		step, _ := sp.Attr("ddp.step").(int64)
		rank, _ := sp.Attr("ddp.rank").(int64)
		want := export.TraceID(export.TraceJob(j.id, run), 0, uint64(step))
		if sp.TraceIDHex() != hex.EncodeToString(want[:]) {
			t.Errorf("rank %d step %d span in trace %s, want %x", rank, step, sp.TraceIDHex(), want)
		}
		if ranksInStep[step] == nil {
			ranksInStep[step] = map[int64]bool{}
		}
		ranksInStep[step][rank] = true
	}
	if len(injected) != 3 || !injected[13] || !injected[14] || !injected[15] {
		t.Errorf("stall spans naming rank 3 in steps %v, want 13, 14 and 15", injected)
	}
	for _, step := range []int64{13, 14, 15} {
		if len(ranksInStep[step]) != 4 {
			t.Errorf("step %d has spans of ranks %v, want all 4", step, ranksInStep[step])
		}
	}
}

// TestHangAcrossNodes: rank 3 (second node) stops before its backward; the
// leader reports it as the rank that never arrived, with the Python stack
// its own agent collected, and the job restarts and finishes.
func TestHangAcrossNodes(t *testing.T) {
	budgetAlongside(t, 90*time.Second)
	needTorch(t)
	j := newJob(t, "2", 1, 10, "--batch-size", "4", "--hang-rank", "3", "--hang-at-step", "7")
	j.args = append(j.args, "--hang-timeout", "4s")
	a := j.startHost()
	b := j.start()
	for _, r := range []*agentRun{a, b} {
		if code := r.wait(3 * time.Minute); code != 0 {
			t.Fatalf("exit code %d\n%s\n%s", code, a.logs(), b.logs())
		}
	}
	logs := a.stderr.String() + b.stderr.String()
	report := regexp.MustCompile(`hang: step 6 bucket \d+ \(generation 0\) has not finished [0-9.]+ s after the first rank arrived; waiting: ranks 0, 1, 2; never arrived: rank 3 \(`)
	if !report.MatchString(logs) {
		t.Fatalf("no hang report naming rank 3\n%s\n%s", a.logs(), b.logs())
	}
	for _, want := range []string{"Python stack of rank 3:", "train.py", "restart_count 1"} {
		if !strings.Contains(logs+a.stdout.String()+b.stdout.String(), want) {
			t.Errorf("output lacks %q\n%s\n%s", want, a.logs(), b.logs())
		}
	}
}
