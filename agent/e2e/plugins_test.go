package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// buildMisbehave builds testdata/plugins/misbehave once per name: the
// binary's name is how it misbehaves (crash, hang, garbage, v2).
func buildMisbehave(t *testing.T, names ...string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	first := filepath.Join(dir, names[0])
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", first, "./agent/e2e/testdata/plugins/misbehave")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the misbehaving plugin: %v\n%s", err, out)
	}
	paths := map[string]string{names[0]: first}
	for _, n := range names[1:] {
		paths[n] = filepath.Join(dir, n)
		if err := os.Link(first, paths[n]); err != nil {
			t.Fatal(err)
		}
	}
	return paths
}

// writeScript writes an executable shell script into a fresh directory.
func writeScript(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "check.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// An exec check that exits 2 restarts the workers within a second of its
// verdict, with its message in the log; the restart counts against
// --max-restarts, and the job then finishes.
func TestPluginExecRestarts(t *testing.T) {
	budget(t, 10*time.Second)
	trigger := filepath.Join(t.TempDir(), "trigger")
	script := writeScript(t, fmt.Sprintf("if [ -e %[1]s ]; then rm -f %[1]s; echo 'fabric port mlx5_0/1 flapped'; exit 2; fi\necho fine\n", trigger))
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
		"--plugin", "exec,command="+script+",interval=500ms,timeout=5s", "timed.py", "4")
	r.workerPIDs(1)
	if err := os.WriteFile(trigger, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(60 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, r.logs())
	}
	logs := r.stderr.String()
	found, ok1 := logTime(logs, `health finding.*fabric port mlx5_0/1 flapped`)
	acted, ok2 := logTime(logs, `health check: stopping the job's workers.*fabric port mlx5_0/1 flapped`)
	restarted, ok3 := logTime(logs, `restarting worker group`)
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("want the finding, the decision and the restart in the log\n%s", r.logs())
	}
	// The agent acts within a second of the verdict; the restart also
	// waits for the old worker to stop (slower under the race detector
	// on a loaded CI machine).
	// (The agent acts on the verdict before it logs it: a negative gap.)
	if d := acted.Sub(found); d > time.Second {
		t.Errorf("acted %v after the finding, want within 1s\n%s", d, r.logs())
	}
	if d := restarted.Sub(found); d > 3*time.Second {
		t.Errorf("restarted %v after the finding, want within 3s\n%s", d, r.logs())
	}
	if !strings.Contains(r.stdout.String(), "restart_count=1") {
		t.Errorf("no restarted worker\n%s", r.logs())
	}
}

// An exec check that exits 3 drains the node: the agent exits 3.
func TestPluginExecDrains(t *testing.T) {
	budget(t, 10*time.Second)
	script := writeScript(t, "echo 'node scheduled for maintenance'; exit 3\n")
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "1", "--max-restarts", "3",
		"--plugin", "exec,command="+script+",interval=1s", "timed.py", "30")
	if code := r.wait(30 * time.Second); code != 3 {
		t.Fatalf("exit %d, want 3 (drained)\n%s", code, r.logs())
	}
	if !strings.Contains(r.stderr.String(), "node scheduled for maintenance") {
		t.Errorf("the check's message is not in the log\n%s", r.logs())
	}
}

// A drain finding while the rendezvous still waits for the other nodes
// (here one that never comes) is still a drain: exit 3, not the cancelled
// wait's exit 1.
func TestPluginExecDrainsDuringRendezvous(t *testing.T) {
	budget(t, 10*time.Second)
	script := writeScript(t, "echo 'node scheduled for maintenance'; exit 3\n")
	r := startAgent(t, nil, "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--rdzv-id", "drain-in-rdzv", "--plugin", "exec,command="+script+",interval=1s", "timed.py", "30")
	if code := r.wait(30 * time.Second); code != 3 {
		t.Fatalf("exit %d, want 3 (drained)\n%s", code, r.logs())
	}
	if strings.Contains(r.stdout.String(), "ready") {
		t.Errorf("a worker started without its second node\n%s", r.logs())
	}
}

// A plugin of another protocol version, an unknown option or a missing
// binary stops the agent before the job, with one line.
func TestPluginRefused(t *testing.T) {
	budget(t, 10*time.Second)
	bins := buildMisbehave(t, "v2")
	// Paths that exist but cannot run were started and retried forever,
	// "permission denied" at each restart, with a job running unwatched.
	notExec := filepath.Join(t.TempDir(), "plugin")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ spec, want string }{
		{bins["v2"], "speaks plugin protocol 2, this ddp-agent speaks 1"},
		{"exec,command=true,colour=blue", `unknown option "colour"`},
		{"/nonexistent/plugin", "no such file"},
		{"nosuchplugin", "no bundled plugin of that name"},
		{notExec, "not executable"},
		{t.TempDir(), "a directory, not an executable"},
	} {
		r := startAgent(t, nil, "--standalone", "--plugin", tc.spec, "timed.py", "30")
		if code := r.wait(20 * time.Second); code != 2 {
			t.Errorf("--plugin %s: exit %d, want 2\n%s", tc.spec, code, r.logs())
			continue
		}
		if !strings.Contains(r.stderr.String(), tc.want) {
			t.Errorf("--plugin %s: want %q in\n%s", tc.spec, tc.want, r.logs())
		}
		if strings.Contains(r.stdout.String(), "ready") {
			t.Errorf("--plugin %s: a worker started", tc.spec)
		}
	}
}

// Plugins that crash, hang or write garbage before their handshake are
// logged and restarted; the job runs and finishes as without them.
func TestPluginFaultsNeverStopTraining(t *testing.T) {
	budgetAlongside(t, 15*time.Second)
	bins := buildMisbehave(t, "crash", "hang", "garbage")
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "1",
		"--plugin", bins["crash"], "--plugin", bins["hang"], "--plugin", bins["garbage"], "timed.py", "9")
	if code := r.wait(60 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, r.logs())
	}
	logs := r.stderr.String()
	for _, want := range []string{
		`plugin failed.*plugin=crash.*exited`,
		`plugin failed.*plugin=hang.*hung`,
		`failed.*plugin=garbage`,
	} {
		if _, ok := logTime(logs, want); !ok {
			t.Errorf("no log line with %q\n%s", want, r.logs())
		}
	}
	if n := strings.Count(logs, "plugin restarted"); n == 0 {
		t.Errorf("no plugin was restarted\n%s", r.logs())
	}
}

// childPIDs lists the live processes whose parent is pid.
func childPIDs(pid int) []int {
	var kids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, n)
		}
	}
	return kids
}

// The agent SIGKILLed leaves no process behind: not its plugins, not its
// workers, and not what either started, a daemon in a session of its own
// included. Before the guard (agent/guard), the workers' subprocesses,
// shells, daemons and pool processes, and the daemons of a plugin's
// checks, lived on under pid 1. Nor does it leave its temporary dirs:
// before, the run's and the control socket's stayed for good, and the
// store's (with the job's TLS key) until another agent hosted a store.
func TestAgentSIGKILLedLeavesNoProcess(t *testing.T) {
	budget(t, 10*time.Second)
	bins := buildMisbehave(t, "steady")
	out := t.TempDir()
	check := writeScript(t, "setsid sleep 300 </dev/null >/dev/null 2>&1 &\necho $! >> "+filepath.Join(out, "plugin_daemons")+"\n")
	// The agent's temporary dirs go here, to be seen gone after.
	tmp := t.TempDir()
	// A one-node job on a store it hosts, with a token: a store data dir
	// and a TLS dir too.
	r := startAgent(t, []string{"TMPDIR=" + tmp}, "--nnodes", "1:2", "--rdzv-conf", fastConf, "--rdzv-backend", "c10d", "--rdzv-id", "guarded",
		"--rdzv-endpoint", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--rdzv-token", "a-token-of-thirty-two-characters", "--nproc-per-node", "1",
		"--plugin", "exec,command="+check+",interval=1s", "--plugin", bins["steady"], "descendants.py")
	waitFor(t, 20*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(r.out, "descendants_0"))
		_, perr := os.Stat(filepath.Join(out, "plugin_daemons"))
		return err == nil && perr == nil && strings.Count(r.stderr.String(), "plugin started") == 2
	}, r.logs)
	var plugins []int
	for _, kid := range childPIDs(r.cmd.Process.Pid) {
		exe, _ := os.Readlink("/proc/" + strconv.Itoa(kid) + "/exe")
		if strings.HasSuffix(exe, "ddp-agent-plugins") || strings.HasSuffix(exe, "/steady") {
			plugins = append(plugins, kid)
		}
	}
	if len(plugins) != 2 {
		t.Fatalf("found plugin processes %v, want 2", plugins)
	}
	pids := func(file string) []int {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var ps []int
		for _, f := range strings.Fields(string(b)) {
			p, _ := strconv.Atoi(f)
			ps = append(ps, p)
		}
		return ps
	}
	descendants := pids(filepath.Join(r.out, "descendants_0"))
	daemons := pids(filepath.Join(out, "plugin_daemons"))
	all := append(append(append([]int{}, plugins...), descendants...), daemons...)
	t.Cleanup(func() {
		for _, p := range all {
			syscall.Kill(p, syscall.SIGKILL)
		}
	})
	dirs := func() []string {
		ds, _ := filepath.Glob(filepath.Join(tmp, "ddp-agent-*"))
		return ds
	}
	before := strings.Join(dirs(), " ")
	for _, kind := range []string{"ddp-agent-run-", "ddp-agent-ctl-", "ddp-agent-etcd-", "ddp-agent-etcd-tls-"} {
		if !strings.Contains(before, kind) {
			t.Fatalf("no %s* dir in the agent's TMPDIR: %s", kind, before)
		}
	}
	r.cmd.Process.Signal(syscall.SIGKILL)
	r.wait(10 * time.Second)
	var alive []int
	waitFor(t, 5*time.Second, func() bool {
		alive = alive[:0]
		for _, p := range all {
			if processAlive(p) {
				alive = append(alive, p)
			}
		}
		return len(alive) == 0
	}, func() string {
		return fmt.Sprintf("outlived the agent: %v (plugins %v, the worker's descendants %v, the check's daemons %v)", alive, plugins, descendants, daemons)
	})
	// Its dirs (the run's, the control socket's, the store's) went with it.
	waitFor(t, 5*time.Second, func() bool { return len(dirs()) == 0 }, func() string {
		return fmt.Sprintf("the agent's dirs outlived it: %v (before the kill: %s)", dirs(), before)
	})
}

// hookServer records the webhook's events; delay and status say how it
// answers.
type hookServer struct {
	*httptest.Server
	mu     sync.Mutex
	events []map[string]any
}

func newHookServer(t *testing.T, delay time.Duration, status int) *hookServer {
	h := &hookServer{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var ev map[string]any
		if err := json.NewDecoder(req.Body).Decode(&ev); err == nil {
			h.mu.Lock()
			h.events = append(h.events, ev)
			h.mu.Unlock()
		}
		select {
		case <-time.After(delay):
		case <-req.Context().Done():
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hookServer) kinds() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var k []string
	for _, ev := range h.events {
		k = append(k, fmt.Sprint(ev["kind"]))
	}
	return k
}

// The webhook hears the job's events in order, the root-cause report with
// the worker's failure; a slow and a failing endpoint beside it delay
// nothing and lose only their own events.
func TestPluginWebhook(t *testing.T) {
	budgetAlongside(t, 10*time.Second)
	good := newHookServer(t, 0, http.StatusOK)
	slow := newHookServer(t, time.Minute, http.StatusOK)
	failing := newHookServer(t, 0, http.StatusInternalServerError)
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
		"--plugin", "webhook,url="+good.URL, "--plugin", "webhook,url="+slow.URL+",timeout=1s,retries=0",
		"--plugin", "webhook,url="+failing.URL+",retries=1", "flaky.py")
	if code := r.wait(60 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, r.logs())
	}
	if d := time.Since(r.started); d > 30*time.Second {
		t.Errorf("the job took %v with a slow notifier", d)
	}
	want := []string{"job_started", "worker_failed", "restarted", "job_finished"}
	if got := good.kinds(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v, want %v\n%s", got, want, r.logs())
	}
	good.mu.Lock()
	failed := good.events[1]
	good.mu.Unlock()
	details, _ := failed["details"].(map[string]any)
	if failed["rank"] != float64(1) || !strings.Contains(fmt.Sprint(details["report"]), "root cause") {
		t.Errorf("worker_failed event %v: want rank 1 and the root-cause report", failed)
	}
	if len(failing.kinds()) == 0 {
		t.Errorf("the failing endpoint was never called")
	}
	if !strings.Contains(r.stderr.String(), "notifier events") {
		t.Errorf("no delivery summary\n%s", r.logs())
	}
}

// A plugin frozen with SIGSTOP (a hang that go-plugin's graceful kill
// would wait on forever) is found hung, killed and restarted, and the job
// ends on time.
func TestPluginFrozen(t *testing.T) {
	budgetAlongside(t, 25*time.Second)
	bins := buildMisbehave(t, "steady")
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "1", "--plugin", bins["steady"], "timed.py", "14")
	r.workerPIDs(1)
	var plugin int
	for _, kid := range childPIDs(r.cmd.Process.Pid) {
		if exe, _ := os.Readlink("/proc/" + strconv.Itoa(kid) + "/exe"); strings.HasSuffix(exe, "/steady") {
			plugin = kid
		}
	}
	if plugin == 0 {
		t.Fatalf("no plugin process\n%s", r.logs())
	}
	if err := syscall.Kill(plugin, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(60 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, r.logs())
	}
	logs := r.stderr.String()
	_, hung := logTime(logs, `plugin failed.*plugin=steady.*hung`)
	_, restarted := logTime(logs, `plugin restarted.*plugin=steady`)
	if !hung || !restarted {
		t.Errorf("the frozen plugin was not found hung and restarted\n%s", r.logs())
	}
	if processAlive(plugin) {
		t.Errorf("the frozen plugin %d is still there", plugin)
	}
}

// TestPluginsSilentAndFlooding: two plugins that never complete their
// handshake and one that floods (a 3 MiB warning on a new subject every
// 50 ms, healthy verdicts as fast as it can, stderr as fast as it can).
// The silent ones are waited for at once, not one after the other (each
// 10 s); what the flood costs the agent's log and CPU is bounded.
func TestPluginsSilentAndFlooding(t *testing.T) {
	budgetAlongside(t, 20*time.Second)
	bins := buildMisbehave(t, "silent", "silent2", "flood")
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "1",
		"--plugin", bins["silent"], "--plugin", bins["silent2"], "--plugin", bins["flood"], "timed.py", "5")
	var started time.Time
	waitFor(t, 40*time.Second, func() bool {
		var ok bool
		started, ok = logTime(r.stderr.String(), `workers started`)
		return ok
	}, r.logs)
	t.Logf("workers started %v after the agent", started.Sub(r.started).Round(100*time.Millisecond))
	if took := started.Sub(r.started); took > 15*time.Second {
		t.Errorf("the workers started %v after the agent: the silent plugins were waited for one after the other", took.Round(time.Second))
	}
	cpu0 := procCPU(t, r.cmd.Process.Pid)
	t0 := time.Now()
	time.Sleep(3 * time.Second)
	cpu := procCPU(t, r.cmd.Process.Pid) - cpu0
	if code := r.wait(60 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, tail(r.stderr.String()))
	}
	logs := r.stderr.String()
	share := cpu.Seconds() / time.Since(t0).Seconds()
	t.Logf("agent: %.0f%% of a core with the flooding plugin; its log %d KiB, %d lines of it", 100*share,
		len(logs)>>10, strings.Count(logs, "plugin=flood"))
	if len(logs) > 1<<20 {
		t.Errorf("the agent logged %d KiB with a plugin that floods", len(logs)>>10)
	}
	// Before: 75 % (its verdicts 42 %, its stderr the rest); after: 3 %.
	if share > 0.3 {
		t.Errorf("the agent took %.0f%% of a core with a plugin that floods", 100*share)
	}
}

// procCPU is the user and system time pid has used.
func procCPU(t *testing.T, pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}
