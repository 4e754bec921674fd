package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

// bgProc is a process of a sidecar test run in the background: a sidecar,
// or a torchrun and its workers (in a process group of their own).
type bgProc struct {
	t       *testing.T
	args    []string
	cmd     *exec.Cmd
	stdout  *syncbuf.Buffer
	stderr  *syncbuf.Buffer
	done    chan struct{}
	code    int
	started time.Time
}

func startBG(t *testing.T, env []string, args ...string) *bgProc {
	t.Helper()
	p := &bgProc{t: t, args: args, stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(args[0], args[1:]...)
	p.cmd.Dir = repoRoot
	p.cmd.Env = append(launcherFreeEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		addCPU(t, p.cmd.ProcessState)
		close(p.done)
	}()
	t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		<-p.done
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("%s reported a data race\n%s", filepath.Base(args[0]), p.stderr.String())
		}
		if line, key, ok := repeatedKey(p.stderr.String()); ok {
			t.Errorf("%s's log gives %s twice in a line:\n%s", filepath.Base(args[0]), key, line)
		}
	})
	return p
}

func (p *bgProc) signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// wait returns the exit code, failing the test past d.
func (p *bgProc) wait(d time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		p.signal(syscall.SIGKILL)
		<-p.done
		p.t.Fatalf("still running after %v, killed\n%s", d, p.logs())
		return -1
	}
}

func (p *bgProc) logs() string {
	return "command: " + strings.Join(p.args, " ") + "\nstdout:\n" + tail(p.stdout.String()) + "\nstderr:\n" + tail(p.stderr.String())
}

// startSidecar runs ddp-agent sidecar on sock and waits until it serves:
// its socket, and its "sidecar serving" line, which comes after the
// listen. The socket file alone appears at bind, a moment before: a dial
// then was refused (TestSidecarIdleFlood, once in CI).
func startSidecar(t *testing.T, sock string, args ...string) *bgProc {
	t.Helper()
	p := startBG(t, nil, append([]string{agentBin, "sidecar", "--socket", sock, "--log-level", "debug"}, args...)...)
	waitFor(t, 10*time.Second, func() bool {
		fi, err := os.Stat(sock)
		return err == nil && fi.Mode()&os.ModeSocket != 0 && strings.Contains(p.stderr.String(), `msg="sidecar serving"`)
	}, p.logs)
	return p
}

// sidecarSocket is a socket path of the test's own (never the user's
// default, which another test's sidecar could be using).
func sidecarSocket(t *testing.T, name string) string {
	dir, err := os.MkdirTemp("", "sc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, name, "sidecar.sock")
}

// torchrun starts scripts/torchrun_compat.py with the hook's worker
// environment pointed at sock ("" : none).
func torchrun(t *testing.T, sock string, env []string, args ...string) *bgProc {
	t.Helper()
	env = append(env, "DDP_AGENT_SHIM="+shimLib, "TMPDIR="+t.TempDir())
	if sock != "" {
		env = append(env, "DDP_AGENT_SOCKET="+sock)
	}
	return startBG(t, env, append([]string{python, torchrunCompat(t)}, args...)...)
}

// oneNode is torchrun's flags for a one-node job with a rendezvous of its
// own: torch 1.13's --standalone takes port 29400, which two jobs at once
// would share.
func oneNode(t *testing.T) []string {
	return []string{"--nnodes", "1", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
		"--rdzv_endpoint", "127.0.0.1:" + strconv.Itoa(freePort(t)), "--rdzv_id", "job-" + strconv.Itoa(freePort(t))}
}

// TestSidecarNamesStragglerUnderTorchrun: plain torchrun, 2 workers with
// the hook, a sidecar beside it: the injected straggler's stalls are
// named, a persistent straggler with its cause, and the job's Perfetto
// trace is written once its workers are gone.
func TestSidecarNamesStragglerUnderTorchrun(t *testing.T) {
	budgetAlongside(t, 30*time.Second)
	needTorch(t)
	sock := sidecarSocket(t, "node")
	logDir := t.TempDir()
	sc := startSidecar(t, sock, "--log-dir", logDir, "--job-linger", "1s", "--metrics-addr", "127.0.0.1:0")
	r := torchrun(t, sock, nil, append(oneNode(t), trainPy(), "--steps", "30", "--log-every", "10",
		"--ckpt-dir", t.TempDir(), "--slow-rank", "1", "--slow-steps", stepList(8, 30), "--slow-seconds", "0.6")...)
	// The sidecar's Prometheus endpoint, scraped while the job trains.
	url := waitMatch(t, 90*time.Second, sc.stderr.String, regexp.MustCompile(`msg="serving prometheus metrics of every job".* url=(\S+)`), sc.logs)
	collectives := regexp.MustCompile(`(?m)^ddp_collectives_total\{[^}]*ddp_status="ok"[^}]*\} ([0-9]+)`)
	waitFor(t, 90*time.Second, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		m := collectives.FindStringSubmatch(string(b))
		return m != nil && m[1] != "0"
	}, func() string { return "no ddp_collectives_total from " + url + "\n" + sc.logs() })
	if code := r.wait(150 * time.Second); code != 0 {
		t.Fatalf("torchrun: exit code %d\n%s\nsidecar:\n%s", code, r.logs(), tail(sc.stderr.String()))
	}
	waitFor(t, 15*time.Second, func() bool { return strings.Contains(sc.stderr.String(), "job closed") }, sc.logs)
	log := sc.stderr.String()
	// Stall lines come when a stall stands out of the job's noise, which
	// on a loaded machine it may not; the persistent straggler is named
	// from the whole window, with its cause.
	if !regexp.MustCompile(`persistent straggler: rank 1 .*cause compute`).MatchString(log) {
		t.Errorf("rank 1 not named a persistent straggler with cause compute\n%s", tail(log))
	}
	if regexp.MustCompile(`(stall: step \d+ bucket \d+|persistent straggler): rank 0 `).MatchString(log) {
		t.Errorf("the healthy rank 0 was named\n%s", tail(log))
	}
	files, _ := filepath.Glob(filepath.Join(logDir, "*", "trace-gen0.json"))
	if len(files) != 1 {
		t.Fatalf("trace files: got %v, want one trace-gen0.json under %s\n%s", files, logDir, tail(log))
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var trace []map[string]any
	if err := json.Unmarshal(b, &trace); err != nil || len(trace) < 10 {
		t.Fatalf("trace file: %d events, err %v", len(trace), err)
	}
	if !strings.Contains(string(b), "stall") {
		t.Errorf("the Perfetto trace marks no stall")
	}
}

// hangReportAfter is how long after the first arrival the report says it
// was made ("has not finished 10.23 s after the first rank arrived").
func hangReportAfter(log string) (float64, bool) {
	m := regexp.MustCompile(`has not finished ([0-9.]+) s after the first rank arrived`).FindStringSubmatch(log)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}

// TestSidecarHangAbortsAndTorchrunRestarts: a rank hangs under torchrun
// (--max_restarts 1) with a sidecar: the hang is reported with the
// missing rank's Python stack within the hang timeout + 5 s, the job's
// communicators are aborted (the reason reaches the workers), torchrun
// restarts them and training finishes, long before the hook's own
// timeout. A second job of the same user on the node, healthy, is not
// touched. Without the sidecar the same hang waits for the hook's timeout.
func TestSidecarHangAbortsAndTorchrunRestarts(t *testing.T) {
	budgetAlongside(t, 100*time.Second)
	needTorch(t)
	sock := sidecarSocket(t, "node")
	const hangTimeout = 8
	sc := startSidecar(t, sock, "--hang-timeout", strconv.Itoa(hangTimeout))
	hookTimeout := []string{"DDP_AGENT_COLLECTIVE_TIMEOUT=300"}
	hangArgs := []string{trainPy(), "--steps", "24", "--log-every", "4", "--ckpt-every", "4", "--hang-rank", "1", "--hang-at-step", "6"}
	hung := torchrun(t, sock, hookTimeout, append(append(oneNode(t), "--max_restarts", "1"),
		append(hangArgs, "--ckpt-dir", t.TempDir())...)...)
	healthy := torchrun(t, sock, hookTimeout, append(oneNode(t), "--max_restarts", "1", trainPy(),
		"--steps", "40", "--log-every", "10", "--ckpt-dir", t.TempDir())...)
	if code := hung.wait(200 * time.Second); code != 0 {
		t.Fatalf("torchrun with the hang: exit code %d\n%s\nsidecar:\n%s", code, hung.logs(), tail(sc.stderr.String()))
	}
	if code := healthy.wait(200 * time.Second); code != 0 {
		t.Fatalf("healthy torchrun: exit code %d\n%s", code, healthy.logs())
	}
	log := sc.stderr.String()
	after, ok := hangReportAfter(log)
	if !ok {
		t.Fatalf("no hang report\n%s", tail(log))
	}
	if after > hangTimeout+5 {
		t.Errorf("hang reported %.2f s after the first arrival, want within %d s", after, hangTimeout+5)
	}
	if !regexp.MustCompile(`never arrived: rank 1 .*Python stack of rank 1:.*train\.py`).MatchString(log) {
		t.Errorf("the report lacks rank 1's Python stack\n%s", tail(log))
	}
	out := hung.stdout.String() + hung.stderr.String()
	if !strings.Contains(out, "communicator aborted: ddp-agent sidecar: collective hung") {
		t.Errorf("the workers did not fail with the sidecar's reason\n%s", hung.logs())
	}
	if !strings.Contains(out, "restart_count 1") || !strings.Contains(out, "done: steps=24") {
		t.Errorf("torchrun did not restart the workers and finish\n%s", hung.logs())
	}
	if elapsed := time.Since(hung.started); elapsed > 250*time.Second {
		t.Errorf("the job took %v: it waited out the hook's timeout", elapsed)
	}
	hout := healthy.stdout.String() + healthy.stderr.String()
	if strings.Contains(hout, "restart_count 1") || strings.Contains(hout, "aborted") || !strings.Contains(hout, "done: steps=40") {
		t.Errorf("the healthy job of the same user was touched\n%s", healthy.logs())
	}
	if n := strings.Count(log, "aborted the job's communicators"); n != 1 {
		t.Errorf("aborts: got %d, want 1 (the hung job's)\n%s", n, tail(log))
	}

	// The same hang without a sidecar: the hook's own timeout (15 s here).
	plain := torchrun(t, "", []string{"DDP_AGENT_COLLECTIVE_TIMEOUT=15"}, append(oneNode(t),
		append(hangArgs, "--ckpt-dir", t.TempDir(), "--hang-seconds", "60")...)...)
	plain.wait(200 * time.Second)
	pout := plain.stdout.String() + plain.stderr.String()
	if !regexp.MustCompile(`(?i)timed out|timeout`).MatchString(pout) || strings.Contains(pout, "sidecar") {
		t.Errorf("without a sidecar: want the hook's timeout\n%s", plain.logs())
	}
}

// TestSidecarTwoNodes: two torchrun "nodes" on loopback (--nnodes 2, c10d
// rendezvous), a sidecar each: the sidecar of the node with group rank 0
// names the straggler, rank 3, which runs on the other node.
func TestSidecarTwoNodes(t *testing.T) {
	budgetAlongside(t, 120*time.Second)
	needTorch(t)
	port := strconv.Itoa(freePort(t))
	var scs [2]*bgProc
	var runs [2]*bgProc
	for n := range 2 {
		sock := sidecarSocket(t, "node"+strconv.Itoa(n))
		scs[n] = startSidecar(t, sock)
		runs[n] = torchrun(t, sock, nil, "--nnodes", "2", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
			"--rdzv_endpoint", "127.0.0.1:"+port, "--rdzv_id", "two-nodes", trainPy(), "--steps", "30", "--log-every", "10",
			"--ckpt-dir", t.TempDir(), "--slow-rank", "3", "--slow-steps", stepList(8, 30), "--slow-seconds", "1.0")
	}
	var wg sync.WaitGroup
	codes := [2]int{}
	for n := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-runs[n].done:
				codes[n] = runs[n].code
			case <-time.After(200 * time.Second):
				codes[n] = -1
			}
		}()
	}
	wg.Wait()
	for n := range 2 {
		if codes[n] != 0 {
			t.Fatalf("node %d: exit code %d\n%s", n, codes[n], runs[n].logs())
		}
	}
	leader, follower := -1, -1
	for n := range 2 {
		switch log := scs[n].stderr.String(); {
		case strings.Contains(log, "group_rank=0"):
			leader = n
		case strings.Contains(log, "group_rank=1"):
			follower = n
		}
	}
	if leader < 0 || follower < 0 {
		t.Fatalf("sidecars: want one of group rank 0 and one of 1\n0:\n%s\n1:\n%s", tail(scs[0].stderr.String()), tail(scs[1].stderr.String()))
	}
	llog, flog := scs[leader].stderr.String(), scs[follower].stderr.String()
	if !strings.Contains(llog, "relay: follower connected") {
		t.Errorf("the follower's sidecar never reached the leader's relay\nleader:\n%s\nfollower:\n%s", tail(llog), tail(flog))
	}
	if !regexp.MustCompile(`persistent straggler: rank 3 `).MatchString(llog) {
		t.Errorf("the leading sidecar did not name rank 3 (on the other node)\nleader:\n%s\nfollower:\n%s", tail(llog), tail(flog))
	}
	if strings.Contains(flog, "persistent straggler") {
		t.Errorf("the follower analyzed too\n%s", tail(flog))
	}
}

// TestSidecarKilledAndStartedLate: the sidecar SIGKILLed mid-training
// changes nothing for the workers; a sidecar started later (on the same
// socket path, a dead one's file still there) picks up the running
// workers (their communicators redial) and those that register after it,
// of torchrun's restart after a worker failure.
func TestSidecarKilledAndStartedLate(t *testing.T) {
	budgetAlongside(t, 110*time.Second)
	needTorch(t)
	sock := sidecarSocket(t, "node")
	first := startSidecar(t, sock)
	r := torchrun(t, sock, nil, append(oneNode(t), "--max_restarts", "1", trainPy(), "--steps", "30",
		"--log-every", "2", "--ckpt-every", "5", "--ckpt-dir", t.TempDir(), "--sleep-per-step", "0.2",
		"--fail-rank", "1", "--fail-at-step", "16")...)
	waitFor(t, 90*time.Second, func() bool { return strings.Contains(r.stdout.String(), "step 6 ") }, r.logs)
	if !strings.Contains(first.stderr.String(), "watching a new job") {
		t.Fatalf("the first sidecar never saw the job\n%s", first.logs())
	}
	first.signal(syscall.SIGKILL)
	<-first.done
	late := startSidecar(t, sock)
	if code := r.wait(200 * time.Second); code != 0 {
		t.Fatalf("torchrun: exit code %d after the sidecar was killed\n%s", code, r.logs())
	}
	out := r.stdout.String() + r.stderr.String()
	if !strings.Contains(out, "done: steps=30") || !strings.Contains(out, "restart_count 1") {
		t.Errorf("training did not restart once and finish\n%s", r.logs())
	}
	if strings.Contains(out, "aborted: control connection lost") || !strings.Contains(out, "injected failure on rank 1") {
		t.Errorf("a communicator failed for the sidecar's death, or the injected failure never came\n%s", r.logs())
	}
	if !strings.Contains(out, "sidecar connection lost: training goes on") {
		t.Errorf("the shims did not say they lost the sidecar\n%s", r.logs())
	}
	// The running workers redial the late sidecar; those of the restart
	// register with it.
	for gen := range 2 {
		if !regexp.MustCompile(`worker connected.* rank=1 generation=` + strconv.Itoa(gen)).MatchString(late.stderr.String()) {
			t.Errorf("the late sidecar did not pick up rank 1 of generation %d\n%s", gen, late.logs())
		}
	}
}

// TestSidecarPluginAborts: a detector plugin beside the sidecar works as
// under ddp-agent run: its restart-workers verdict (the bundled exec check
// exiting 2) aborts the job's communicators, the workers fail with the
// finding, and torchrun restarts them.
func TestSidecarPluginAborts(t *testing.T) {
	budgetAlongside(t, 60*time.Second)
	needTorch(t)
	trigger := filepath.Join(t.TempDir(), "trigger")
	script := writeScript(t, "if [ -e "+trigger+" ]; then rm -f "+trigger+"; echo 'fabric port mlx5_0/1 flapped'; exit 2; fi\necho fine\n")
	sock := sidecarSocket(t, "node")
	sc := startSidecar(t, sock, "--plugin", "exec,command="+script+",interval=500ms,timeout=5s")
	r := torchrun(t, sock, []string{"DDP_AGENT_COLLECTIVE_TIMEOUT=300"}, append(oneNode(t), "--max_restarts", "1", trainPy(),
		"--steps", "30", "--log-every", "2", "--ckpt-every", "5", "--ckpt-dir", t.TempDir(), "--sleep-per-step", "0.2")...)
	waitFor(t, 90*time.Second, func() bool { return strings.Contains(r.stdout.String(), "step 6 ") }, r.logs)
	if err := os.WriteFile(trigger, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(200 * time.Second); code != 0 {
		t.Fatalf("torchrun: exit code %d\n%s\nsidecar:\n%s", code, r.logs(), tail(sc.stderr.String()))
	}
	out := r.stdout.String() + r.stderr.String()
	if !strings.Contains(out, "communicator aborted: plugin exec") || !strings.Contains(out, "fabric port mlx5_0/1 flapped") {
		t.Errorf("the workers did not fail with the plugin's finding\n%s", r.logs())
	}
	if !strings.Contains(out, "restart_count 1") || !strings.Contains(out, "done: steps=30") {
		t.Errorf("torchrun did not restart the workers and finish\n%s", r.logs())
	}
}
