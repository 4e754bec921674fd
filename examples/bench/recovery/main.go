// Command recovery measures how long an elastic DDP job takes to recover
// after a node is lost, ddp-agent against torchrun's c10d rendezvous, side by
// side in one run on one machine: every "node" is a separate launcher process
// on loopback.
//
// For each launcher and run it starts -nodes launchers (--nnodes 2:<nodes>,
// --max-restarts 3, c10d rendezvous at 127.0.0.1:<free port>) of a real gloo
// job (worker.py: all_reduce every 50 ms), waits until the full world has
// formed, SIGKILLs one launcher that does not host the rendezvous store
// (and its workers: a dead node takes them with it), and measures the time
// from the kill until every surviving worker slot runs user code again in
// a world of the survivors. It prints Markdown tables: recovery (median, min,
// max), start-up, the ratio ddp-agent/torchrun, and where the time goes.
//
//	go run ./examples/bench/recovery -agent bin/ddp-agent -python /usr/bin/python3 \
//	    -torchrun-compat scripts/torchrun_compat.py -nodes 3 -nproc 1 -runs 3
//
// Where the time goes comes from three sources: worker.py's own lines
// (collective failed, replacement started, world re-formed), the launchers'
// logs, stamped line by line as they arrive (torchrun runs with LOGLEVEL=INFO
// for that; ddp-agent's messages are matched best effort), and for torchrun
// rdzv_probe.py, a read-only client of the c10d store that records when the
// dead node was dropped, when the last call began and when the round closed.
//
// Each run's launcher logs, workers.jsonl and rdzv.jsonl are in a temporary
// directory, removed after a good run and kept (and named) otherwise, or
// always with -keep. Everything started runs in process groups of its own
// and carries RECOVERY_BENCH_TAG in its environment: teardown, Ctrl-C (twice:
// at once) and exit signal and sweep them; if this program is SIGKILLed, the
// launchers get SIGKILL through their parent-death signal and the workers
// and the probe notice their parent is gone.
//
// It exits non-zero when a run could not be measured at all (most often: the
// initial world never formed); a recovery that times out is reported as
// "> timeout" in the table instead.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type config struct {
	agent, python, compat, script string
	nodes, nproc, minNodes, runs  int
	timeout, settle, grace        time.Duration
	only                          string
	keep, probe                   bool
	torchrunLogLevel              string
}

// marker turns a launcher log line that contains substr into a named event,
// so the report can say when the launcher noticed the fault and when its
// rendezvous completed.
type marker struct{ substr, event string }

const (
	evNoticed  = "noticed"  // the launcher saw its workers fail (or the node go)
	evDropped  = "dropped"  // the launcher dropped the dead node from the rendezvous
	evRdzvDone = "rdzvDone" // the launcher's rendezvous of the new round completed
)

type launcherKind struct {
	name    string
	argv    func(port int, id string) []string
	env     []string // added to the launcher's environment
	markers []marker
	probe   bool // rdzv_probe.py can read its rendezvous state (torchrun's c10d)
}

func main() {
	var c config
	flag.StringVar(&c.agent, "agent", "bin/ddp-agent", "ddp-agent binary")
	flag.StringVar(&c.python, "python", "/usr/bin/python3", "Python with PyTorch (workers, and torchrun itself)")
	flag.StringVar(&c.compat, "torchrun-compat", "scripts/torchrun_compat.py", "torchrun wrapper that works on Python 3.11")
	flag.IntVar(&c.nodes, "nodes", 3, "launcher processes (\"nodes\") per job; one of them is killed")
	flag.IntVar(&c.nproc, "nproc", 1, "workers per node")
	flag.IntVar(&c.minNodes, "min-nodes", 2, "MIN of --nnodes MIN:<nodes>; must be at most nodes-1 so the job survives the loss")
	flag.IntVar(&c.runs, "runs", 3, "runs per launcher (launchers interleaved run by run)")
	flag.StringVar(&c.only, "only", "both", "which launchers: ddp-agent, torchrun or both")
	flag.DurationVar(&c.timeout, "timeout", 180*time.Second, "limit for forming the initial world, and again for recovering after the kill")
	flag.DurationVar(&c.settle, "settle", 3*time.Second, "how long the full world runs before the kill")
	flag.DurationVar(&c.grace, "grace", 5*time.Second, "teardown: time between SIGTERM and SIGKILL")
	flag.BoolVar(&c.keep, "keep", false, "keep every run's log directory (failed runs keep theirs anyway)")
	flag.BoolVar(&c.probe, "probe", true, "torchrun: watch the c10d rendezvous state with rdzv_probe.py (a read-only store client), to show when the dead node was dropped and the last call began")
	flag.StringVar(&c.torchrunLogLevel, "torchrun-loglevel", "INFO", "LOGLEVEL for torchrun, so its log shows when it noticed the fault and finished the rendezvous (logging only; empty: torchrun's default)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./examples/bench/recovery [flags]\n\n"+
			"Measures recovery after the loss of one node: ddp-agent against torchrun (c10d rendezvous).\n"+
			"Run it from the repository root.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "recovery: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}

	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "\nrecovery: %v: stopping, tearing every launcher down (again to kill at once)\n", s)
		cancel()
		<-sigs
		fmt.Fprintln(os.Stderr, "recovery: second signal: SIGKILL to everything we started")
		killEverything()
		os.Exit(130)
	}()

	code := run(ctx, c)
	killEverything() // a no-op unless something escaped a teardown
	if ctx.Err() != nil && code == 0 {
		code = 130
	}
	os.Exit(code)
}

func run(ctx context.Context, c config) int {
	if err := check(&c); err != nil {
		fmt.Fprintln(os.Stderr, "recovery:", err)
		return 2
	}
	kinds := launcherKinds(c)
	results := map[string][]result{}
	broken := map[string]error{}
	// Interleave the launchers run by run, so drift in machine load hits both alike.
	for i := 0; i < c.runs && ctx.Err() == nil; i++ {
		for _, k := range kinds {
			if broken[k.name] != nil || ctx.Err() != nil {
				continue
			}
			r, err := measure(ctx, c, k, i)
			if err != nil {
				if ctx.Err() != nil {
					fmt.Fprintf(os.Stderr, "%-9s run %d: interrupted (%v)\n", k.name, i, err)
					break
				}
				fmt.Fprintf(os.Stderr, "%-9s run %d: FAILED: %v\n", k.name, i, err)
				broken[k.name] = err
				continue
			}
			fmt.Fprintf(os.Stderr, "%-9s run %d: %s\n", k.name, i, r.describe())
			results[k.name] = append(results[k.name], r)
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "recovery: interrupted")
		return 130
	}
	report(os.Stdout, c, kinds, results, broken)
	if len(broken) > 0 {
		return 1
	}
	return 0
}

func check(c *config) error {
	if c.nodes < 2 || c.nproc < 1 || c.runs < 1 {
		return fmt.Errorf("need -nodes >= 2, -nproc >= 1, -runs >= 1")
	}
	if c.minNodes < 1 || c.minNodes > c.nodes-1 {
		return fmt.Errorf("-min-nodes %d: the job must survive the loss of one of %d nodes, so it must be between 1 and %d", c.minNodes, c.nodes, c.nodes-1)
	}
	switch c.only {
	case "both", "ddp-agent", "torchrun":
	default:
		return fmt.Errorf("-only %q: want ddp-agent, torchrun or both", c.only)
	}
	var err error
	if c.script, err = filepath.Abs("examples/bench/recovery/worker.py"); err != nil {
		return err
	}
	need := []string{c.python, c.script}
	if c.only != "torchrun" {
		need = append(need, c.agent)
	}
	if c.only != "ddp-agent" {
		need = append(need, c.compat)
	}
	for _, p := range need {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("need %s (run from the repository root; see -h): %w", p, err)
		}
	}
	// Absolute paths: the launchers run in the repository root, but say
	// exactly what ran in the logs.
	for _, p := range []*string{&c.agent, &c.compat} {
		if a, err := filepath.Abs(*p); err == nil {
			*p = a
		}
	}
	return nil
}

func launcherKinds(c config) []launcherKind {
	nnodes := fmt.Sprintf("%d:%d", c.minNodes, c.nodes)
	nproc := strconv.Itoa(c.nproc)
	agent := launcherKind{
		name: "ddp-agent",
		argv: func(port int, id string) []string {
			return []string{c.agent, "run", "--nnodes", nnodes, "--nproc-per-node", nproc, "--max-restarts", "3",
				"--rdzv-backend", "c10d", "--rdzv-endpoint", fmt.Sprintf("127.0.0.1:%d", port), "--rdzv-id", id,
				"--python", c.python, c.script}
		},
		// ddp-agent's log messages (agent/rdzv is new: best effort; a
		// marker that never matches only leaves a "-" in the breakdown).
		markers: []marker{
			{`msg="worker failed"`, evNoticed},
			{`msg="new generation"`, evNoticed},
			{`msg="node is gone`, evNoticed},
			{`msg="node is gone`, evDropped},
			{`msg="workers started"`, evRdzvDone},
		},
	}
	// torchrun with its defaults: that is what users get (see the report's notes).
	torchrun := launcherKind{
		name: "torchrun",
		argv: func(port int, id string) []string {
			return []string{c.python, c.compat, "--nnodes", nnodes, "--nproc_per_node", nproc, "--max_restarts", "3",
				"--rdzv_backend", "c10d", "--rdzv_endpoint", fmt.Sprintf("127.0.0.1:%d", port), "--rdzv_id", id,
				c.script}
		},
		markers: []marker{
			// torch/distributed/elastic/agent/server/api.py, _invoke_run and _rendezvous (INFO).
			{"Worker group FAILED", evNoticed},
			{"Worker group UNHEALTHY", evNoticed},
			{"Rendezvous complete for workers", evRdzvDone},
		},
		probe: true,
	}
	if c.torchrunLogLevel != "" {
		torchrun.env = append(torchrun.env, "LOGLEVEL="+c.torchrunLogLevel)
	}
	switch c.only {
	case "ddp-agent":
		return []launcherKind{agent}
	case "torchrun":
		return []launcherKind{torchrun}
	}
	return []launcherKind{agent, torchrun}
}

// result of one run. Durations of phases are from the kill; -1 when unknown.
type result struct {
	startup   time.Duration // first launch to the full world running user code
	recovery  time.Duration // kill to the survivors' world running user code
	timedOut  bool          // recovery did not happen within -timeout
	failed    string        // recovery failed for another reason (the survivors gave up)
	storeHost int           // launcher index hosting the rendezvous store
	victim    int           // launcher index killed
	victimGR  int           // its GROUP_RANK in the full world
	// Phases, from the kill: a survivor's collective failed, a surviving
	// launcher noticed, the last surviving launcher finished its rendezvous,
	// the last replacement worker started.
	collFailed, noticed, rdzvDone, spawned time.Duration
	// From the torchrun rendezvous probe: the dead node dropped (its
	// keep-alive expired: the next round opens), the last call began (min
	// nodes joined), the round completed; and the last call's length.
	dropped, lastCall, complete, lastCallLen time.Duration
	keptDir                                  string
}

func (r result) ok() bool { return !r.timedOut && r.failed == "" }

func (r result) describe() string {
	var b strings.Builder
	switch {
	case r.timedOut:
		fmt.Fprintf(&b, "recovery > timeout")
	case r.failed != "":
		fmt.Fprintf(&b, "recovery FAILED (%s)", r.failed)
	default:
		fmt.Fprintf(&b, "recovery %v", r.recovery.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, ", startup %v; killed launcher %d (group rank %d), store host launcher %d",
		r.startup.Round(time.Millisecond), r.victim, r.victimGR, r.storeHost)
	fmt.Fprintf(&b, "; after the kill: collective failed %s, launcher noticed %s, dead node dropped %s",
		phase(r.collFailed), phase(r.noticed), phase(r.dropped))
	if r.lastCall >= 0 || r.complete >= 0 {
		fmt.Fprintf(&b, ", last call began %s (%s long), round complete %s",
			phase(r.lastCall), phaseLen(r.lastCallLen), phase(r.complete))
	}
	fmt.Fprintf(&b, ", rendezvous done %s, new workers started %s", phase(r.rdzvDone), phase(r.spawned))
	if r.keptDir != "" {
		fmt.Fprintf(&b, "; logs in %s", r.keptDir)
	}
	return b.String()
}

func phase(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return "+" + fmtDur(d)
}

func phaseLen(d time.Duration) string {
	if d < 0 {
		return "?"
	}
	return fmtDur(d)
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	default:
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
}

// ---------------------------------------------------------------------------
// One run.

// node is one launcher process.
type node struct {
	idx     int
	cmd     *exec.Cmd
	pid     int // also its process group id (Setpgid)
	logPath string
	done    chan struct{} // closed once cmd.Wait returned
	waitErr error
	logDone chan struct{} // closed once the log pipe reached EOF

	mu     sync.Mutex
	events map[string][]time.Time
	tail   []string // last lines of its log
}

func (n *node) exited() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// eventsAfter is the first time after t0 the launcher logged event name.
func (n *node) eventsAfter(name string, t0 time.Time) (first time.Time, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, t := range n.events[name] {
		if t.After(t0) && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first, !first.IsZero()
}

func (n *node) lastLines() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return "    " + strings.Join(n.tail, "\n    ")
}

func measure(ctx context.Context, c config, k launcherKind, runIdx int) (res result, err error) {
	res = result{storeHost: -1, victim: -1, victimGR: -1, collFailed: -1, noticed: -1, rdzvDone: -1, spawned: -1,
		dropped: -1, lastCall: -1, complete: -1, lastCallLen: -1}
	dir, err := os.MkdirTemp("", "recovery-bench-"+k.name+"-")
	if err != nil {
		return res, err
	}
	var nodes, helpers []*node // the launchers; the probe
	defer func() {
		teardown(append(append([]*node(nil), nodes...), helpers...), c.grace)
		if err != nil || !res.ok() || c.keep {
			res.keptDir = dir
			if err != nil {
				err = fmt.Errorf("%w\n  logs kept in %s", err, dir)
			}
			return
		}
		if rmErr := os.RemoveAll(dir); rmErr != nil {
			fmt.Fprintf(os.Stderr, "recovery: remove %s: %v\n", dir, rmErr)
		}
	}()

	port, err := freePort()
	if err != nil {
		return res, err
	}
	workerLog := filepath.Join(dir, "workers.jsonl")
	if err := os.WriteFile(workerLog, nil, 0o644); err != nil {
		return res, err
	}
	tag := fmt.Sprintf("%s-%s-%d-%d", benchTag, k.name, runIdx, port)
	id := fmt.Sprintf("bench%d", runIdx)
	full := c.nodes * c.nproc
	left := (c.nodes - 1) * c.nproc

	tLaunch := time.Now()
	for i := 0; i < c.nodes; i++ {
		n, err := startNode(k, i, dir, port, id, tag, workerLog)
		if err != nil {
			return res, fmt.Errorf("start launcher %d: %w", i, err)
		}
		nodes = append(nodes, n)
	}
	fmt.Fprintf(os.Stderr, "%-9s run %d: %d launchers up (rendezvous 127.0.0.1:%d, logs %s), waiting for a world of %d\n",
		k.name, runIdx, c.nodes, port, dir, full)

	wl := &workerLogReader{path: workerLog}
	exitedErr := func(which []*node) error {
		for _, n := range which {
			if n.exited() {
				<-waitTimeout(n.logDone, time.Second)
				return fmt.Errorf("launcher %d (pid %d) exited: %v; last lines of %s:\n%s", n.idx, n.pid, n.waitErr, n.logPath, n.lastLines())
			}
		}
		return nil
	}

	// 1. The full world forms.
	var formedAt time.Time
	deadline := time.Now().Add(c.timeout)
	for {
		if err := wl.poll(); err != nil {
			return res, err
		}
		if t, ok := wl.formed(full, time.Time{}, -1); ok {
			formedAt = t
			break
		}
		if err := exitedErr(nodes); err != nil {
			return res, fmt.Errorf("initial world of %d never formed: %w", full, err)
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("initial world of %d did not form within %v (%d worker lines so far)", full, c.timeout, len(wl.recs))
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return res, err
		}
	}
	res.startup = formedAt.Sub(tLaunch)
	if err := sleepCtx(ctx, c.settle); err != nil {
		return res, err
	}
	if err := wl.poll(); err != nil {
		return res, err
	}
	if err := exitedErr(nodes); err != nil {
		return res, fmt.Errorf("the full world broke up before the kill: %w", err)
	}

	// 2. Pick the victim: a launcher that does not host the rendezvous store.
	host, err := storeHost(port, nodes)
	if err != nil {
		return res, err
	}
	res.storeHost = host.idx
	var victim *node
	for i := len(nodes) - 1; i >= 0; i-- {
		if nodes[i] != host {
			victim = nodes[i]
			break
		}
	}
	res.victim = victim.idx
	res.victimGR = wl.groupRankOf(victim.idx, full)

	var probe *node
	probeLog := filepath.Join(dir, "rdzv.jsonl")
	if k.probe && c.probe {
		p, perr := startProbe(ctx, c, dir, port, id, tag, probeLog)
		if p != nil {
			helpers = append(helpers, p)
		}
		switch {
		case ctx.Err() != nil:
			return res, ctx.Err()
		case perr != nil:
			fmt.Fprintf(os.Stderr, "%-9s run %d: no rendezvous probe (the breakdown lacks its columns): %v\n", k.name, runIdx, perr)
		default:
			probe = p
		}
	}
	var survivors []*node
	for _, n := range nodes {
		if n != victim {
			survivors = append(survivors, n)
		}
	}

	// 3. Kill it, and its workers right after: a dead node takes them along.
	// Its process tree is read first, for the workers in process groups of
	// their own (ddp-agent's); they would die of their parent-death signal
	// anyway, torchrun's would live on as orphans.
	tree := descendants(victim.pid)
	t0 := time.Now()
	if err := syscall.Kill(victim.pid, syscall.SIGKILL); err != nil {
		return res, fmt.Errorf("kill launcher %d (pid %d): %w", victim.idx, victim.pid, err)
	}
	killGroup(victim.pid, syscall.SIGKILL)
	for _, p := range tree {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		killGroup(p.pgid, syscall.SIGKILL)
	}

	// 4. The survivors' world forms again.
	deadline = t0.Add(c.timeout)
	var recoveredAt time.Time
	for {
		if err := wl.poll(); err != nil {
			return res, err
		}
		if t, ok := wl.formed(left, t0, victim.idx); ok {
			recoveredAt = t
			break
		}
		alive := 0
		for _, n := range survivors {
			if !n.exited() {
				alive++
			}
		}
		if alive == 0 {
			<-waitTimeout(survivors[0].logDone, time.Second)
			res.failed = fmt.Sprintf("every surviving launcher exited; launcher %d: %v, last lines:\n%s",
				survivors[0].idx, survivors[0].waitErr, survivors[0].lastLines())
			break
		}
		if time.Now().After(deadline) {
			res.timedOut = true
			break
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return res, err
		}
	}
	if !recoveredAt.IsZero() {
		res.recovery = recoveredAt.Sub(t0)
	}

	// Where the time went.
	if t, ok := wl.first("fail", t0, victim.idx, -1); ok {
		res.collFailed = t.Sub(t0)
	}
	if t, ok := wl.lastOfFirsts("start", left, t0, victim.idx); ok {
		res.spawned = t.Sub(t0)
	}
	var noticed, dropped, rdzv time.Time
	allRdzv := true
	for _, n := range survivors {
		if t, ok := n.eventsAfter(evNoticed, t0); ok && (noticed.IsZero() || t.Before(noticed)) {
			noticed = t
		}
		if t, ok := n.eventsAfter(evDropped, t0); ok && (dropped.IsZero() || t.Before(dropped)) {
			dropped = t
		}
		if t, ok := n.eventsAfter(evRdzvDone, t0); ok {
			if t.After(rdzv) {
				rdzv = t
			}
		} else {
			allRdzv = false
		}
	}
	if !noticed.IsZero() {
		res.noticed = noticed.Sub(t0)
	}
	if !dropped.IsZero() {
		res.dropped = dropped.Sub(t0)
	}
	if allRdzv && !rdzv.IsZero() {
		res.rdzvDone = rdzv.Sub(t0)
	}
	if probe != nil {
		probeBreakdown(probeLog, t0, &res)
	}
	return res, nil
}

func startNode(k launcherKind, idx int, dir string, port int, id, tag, workerLog string) (*node, error) {
	env := append(append([]string(nil), k.env...),
		"RECOVERY_BENCH_LOG="+workerLog,
		"RECOVERY_BENCH_NODE="+strconv.Itoa(idx),
	)
	return startProc(idx, k.argv(port, id), env, tag, filepath.Join(dir, fmt.Sprintf("node%d.log", idx)), k.markers)
}

// startProbe starts rdzv_probe.py against the rendezvous store and waits
// for its first reading of the state.
func startProbe(ctx context.Context, c config, dir string, port int, id, tag, out string) (*node, error) {
	script := filepath.Join(filepath.Dir(c.script), "rdzv_probe.py")
	argv := []string{c.python, script, "127.0.0.1", strconv.Itoa(port), id, out}
	p, err := startProc(-1, argv, nil, tag, filepath.Join(dir, "rdzv_probe.log"), nil)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if st, err := os.Stat(out); err == nil && st.Size() > 0 {
			return p, nil
		}
		if p.exited() {
			<-waitTimeout(p.logDone, time.Second)
			return p, fmt.Errorf("rdzv_probe.py exited: %v:\n%s", p.waitErr, p.lastLines())
		}
		if time.Now().After(deadline) {
			return p, fmt.Errorf("rdzv_probe.py read no state within 30s")
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return p, err
		}
	}
}

type probeRecord struct {
	T        float64  `json:"t"`
	Round    int      `json:"round"`
	Complete bool     `json:"complete"`
	Deadline *float64 `json:"deadline"`
}

// probeBreakdown reads the probe's log: the round at the kill, when the
// next round opened (the dead node's keep-alive had expired and it was
// dropped), when its last call began and how long it was, when it completed.
func probeBreakdown(path string, t0 time.Time, r *result) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	at := func(sec float64) time.Time {
		s, f := math.Modf(sec)
		return time.Unix(int64(s), int64(f*1e9))
	}
	var recs []probeRecord
	for _, line := range bytes.Split(b, []byte("\n")) {
		var pr probeRecord
		if json.Unmarshal(line, &pr) == nil {
			recs = append(recs, pr)
		}
	}
	round := -1
	for _, pr := range recs {
		if !at(pr.T).After(t0) {
			round = pr.Round
		}
	}
	if round < 0 {
		return
	}
	for _, pr := range recs {
		t := at(pr.T)
		if !t.After(t0) || pr.Round <= round {
			continue
		}
		if r.dropped < 0 {
			r.dropped = t.Sub(t0)
		}
		if r.lastCall < 0 && pr.Deadline != nil {
			r.lastCall = t.Sub(t0)
			r.lastCallLen = at(*pr.Deadline).Sub(t)
		}
		if r.complete < 0 && pr.Complete {
			r.complete = t.Sub(t0)
		}
	}
}

// startProc starts one process of a run (a launcher, or the probe) in a
// process group of its own, its output stamped line by line into logPath.
func startProc(idx int, argv, env []string, tag, logPath string, markers []marker) (*node, error) {
	n := &node{
		idx:     idx,
		logPath: logPath,
		done:    make(chan struct{}),
		logDone: make(chan struct{}),
		events:  map[string][]time.Time{},
	}
	logf, err := os.Create(n.logPath)
	if err != nil {
		return nil, err
	}
	// Our own pipe (not an io.Writer for exec), so that Wait returns when
	// the launcher exits even if a worker still holds the pipe; every line
	// is stamped with the time it arrived.
	pr, pw, err := os.Pipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Env = append(cmd.Env, tagVar+"="+tag, "PYTHONUNBUFFERED=1")
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = pw, pw
	// A process group of its own, so teardown reaches torchrun's workers;
	// SIGKILL if this benchmark dies (its workers follow: ddp-agent's by
	// their parent-death signal, torchrun's by worker.py's orphan check).
	// Pdeathsig fires when the forking thread exits; Go only ends threads
	// whose goroutine locked them, which this program never does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(logf, "# %s\n", strings.Join(argv, " "))
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		logf.Close()
		return nil, err
	}
	n.cmd, n.pid = cmd, cmd.Process.Pid
	register(tag, n.pid)
	go func() {
		n.waitErr = cmd.Wait()
		close(n.done)
	}()
	go n.copyLog(pr, logf, markers)
	return n, nil
}

func (n *node) copyLog(pr *os.File, logf *os.File, markers []marker) {
	defer close(n.logDone)
	defer pr.Close()
	defer logf.Close()
	br := bufio.NewReaderSize(pr, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			now := time.Now()
			line = strings.TrimRight(line, "\r\n")
			fmt.Fprintf(logf, "%s %s\n", now.Format("15:04:05.000000"), line)
			n.mu.Lock()
			for _, m := range markers {
				if strings.Contains(line, m.substr) {
					n.events[m.event] = append(n.events[m.event], now)
				}
			}
			if len(line) > 300 {
				line = line[:300] + "..."
			}
			n.tail = append(n.tail, line)
			if len(n.tail) > 15 {
				n.tail = n.tail[len(n.tail)-15:]
			}
			n.mu.Unlock()
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				fmt.Fprintf(logf, "# log pipe: %v\n", err)
			}
			return
		}
	}
}

// ---------------------------------------------------------------------------
// The workers' log.

type record struct {
	T        float64 `json:"t"`
	Phase    string  `json:"phase"`
	Rank     int     `json:"rank"`
	World    int     `json:"world"`
	Gen      int     `json:"gen"`
	PID      int     `json:"pid"`
	Node     int     `json:"node"`
	Launcher int     `json:"launcher"`
}

func (r record) at() time.Time {
	sec, frac := math.Modf(r.T)
	return time.Unix(int64(sec), int64(frac*1e9))
}

type workerLogReader struct {
	path string
	off  int64
	part []byte
	recs []record
}

// poll reads the lines appended since the last call.
func (w *workerLogReader) poll() error {
	f, err := os.Open(w.path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(w.off, io.SeekStart); err != nil {
		return err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	w.off += int64(len(b))
	b = append(w.part, b...)
	last := bytes.LastIndexByte(b, '\n')
	if last < 0 {
		w.part = b
		return nil
	}
	w.part = append([]byte(nil), b[last+1:]...)
	for _, line := range bytes.Split(b[:last], []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r record
		if err := json.Unmarshal(line, &r); err != nil {
			return fmt.Errorf("%s: bad line %q: %w", w.path, line, err)
		}
		w.recs = append(w.recs, r)
	}
	return nil
}

// formed reports whether every rank of a world of size world logged its
// "init" line after t0 (from a launcher other than exclude), and when the
// last of them did: the moment the whole world runs user code.
func (w *workerLogReader) formed(world int, t0 time.Time, exclude int) (time.Time, bool) {
	return w.lastOfFirsts("init", world, t0, exclude)
}

// lastOfFirsts takes each rank's first line of the phase after t0, in a
// world of size world and from a launcher other than exclude, and returns
// the latest of them, once every rank has one.
func (w *workerLogReader) lastOfFirsts(phase string, world int, t0 time.Time, exclude int) (time.Time, bool) {
	first := map[int]time.Time{}
	for _, r := range w.recs {
		if r.Phase != phase || r.World != world || r.Rank < 0 || r.Rank >= world || r.Launcher == exclude && exclude >= 0 {
			continue
		}
		t := r.at()
		if !t.After(t0) {
			continue
		}
		if old, ok := first[r.Rank]; !ok || t.Before(old) {
			first[r.Rank] = t
		}
	}
	if len(first) < world {
		return time.Time{}, false
	}
	var last time.Time
	for _, t := range first {
		if t.After(last) {
			last = t
		}
	}
	return last, true
}

// first is the earliest line of the phase after t0, from a launcher other
// than exclude (world: any if < 0).
func (w *workerLogReader) first(phase string, t0 time.Time, exclude, world int) (time.Time, bool) {
	var best time.Time
	for _, r := range w.recs {
		if r.Phase != phase || r.Launcher == exclude || world >= 0 && r.World != world {
			continue
		}
		if t := r.at(); t.After(t0) && (best.IsZero() || t.Before(best)) {
			best = t
		}
	}
	return best, !best.IsZero()
}

func (w *workerLogReader) groupRankOf(launcher, world int) int {
	gr := -1
	for _, r := range w.recs {
		if r.Phase == "init" && r.Launcher == launcher && r.World == world {
			gr = r.Node
		}
	}
	return gr
}

// ---------------------------------------------------------------------------
// Processes: who listens where, process trees, teardown.

// storeHost finds the launcher whose process (or a descendant) listens on
// port: the one that bound the rendezvous endpoint first (torchrun's c10d
// TCPStore) or hosts the embedded etcd (ddp-agent).
func storeHost(port int, nodes []*node) (*node, error) {
	inodes := listeningInodes(port)
	if len(inodes) == 0 {
		return nil, fmt.Errorf("nothing listens on rendezvous port %d (read /proc/net/tcp and tcp6)", port)
	}
	var hosts []*node
	for _, n := range nodes {
		pids := []int{n.pid}
		for _, p := range descendants(n.pid) {
			pids = append(pids, p.pid)
		}
		for _, pid := range pids {
			if ownsSocket(pid, inodes) {
				hosts = append(hosts, n)
				break
			}
		}
	}
	switch len(hosts) {
	case 1:
		return hosts[0], nil
	case 0:
		return nil, fmt.Errorf("port %d is listened on (socket inodes %v), but by none of the launchers or their children", port, keys(inodes))
	default:
		var idx []int
		for _, h := range hosts {
			idx = append(idx, h.idx)
		}
		return nil, fmt.Errorf("more than one launcher listens on rendezvous port %d: %v", port, idx)
	}
}

// listeningInodes returns the socket inodes in LISTEN state on port, IPv4 and IPv6.
func listeningInodes(port int) map[string]bool {
	out := map[string]bool{}
	want := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
			if len(fs) < 10 || fs[3] != "0A" || !strings.HasSuffix(fs[1], want) {
				continue
			}
			if fs[9] != "0" {
				out[fs[9]] = true
			}
		}
	}
	return out
}

func ownsSocket(pid int, inodes map[string]bool) bool {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue
		}
		if ino, ok := strings.CutPrefix(l, "socket:["); ok && inodes[strings.TrimSuffix(ino, "]")] {
			return true
		}
	}
	return false
}

type proc struct{ pid, ppid, pgid int }

func procs() []proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // state ppid pgrp ...
		if len(f) < 3 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgid, _ := strconv.Atoi(f[2])
		out = append(out, proc{pid, ppid, pgid})
	}
	return out
}

// descendants of pid (not pid itself), as of now.
func descendants(pid int) []proc {
	all := procs()
	children := map[int][]proc{}
	for _, p := range all {
		children[p.ppid] = append(children[p.ppid], p)
	}
	var out []proc
	queue := []int{pid}
	for len(queue) > 0 {
		q := queue[0]
		queue = queue[1:]
		for _, c := range children[q] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

// killGroup signals process group pgid, never our own or init's.
func killGroup(pgid int, sig syscall.Signal) {
	if pgid <= 1 || pgid == syscall.Getpgrp() {
		return
	}
	_ = syscall.Kill(-pgid, sig)
}

// teardown stops every launcher of a run and everything they started:
// SIGTERM to each process group, SIGKILL after grace, then SIGKILL to any
// process that still carries the run's tag in its environment.
func teardown(nodes []*node, grace time.Duration) {
	if len(nodes) == 0 {
		return
	}
	var tree []proc
	for _, n := range nodes {
		tree = append(tree, descendants(n.pid)...)
	}
	for _, n := range nodes {
		if !n.exited() {
			killGroup(n.pid, syscall.SIGTERM)
		}
	}
	for _, p := range tree {
		if p.pgid != p.pid || p.pgid == syscall.Getpgrp() {
			continue
		}
		killGroup(p.pgid, syscall.SIGTERM) // a worker's own group (ddp-agent's)
	}
	deadline := time.After(grace)
wait:
	for _, n := range nodes {
		select {
		case <-n.done:
		case <-deadline:
			break wait
		}
	}
	for _, n := range nodes {
		killGroup(n.pid, syscall.SIGKILL)
	}
	for _, p := range tree {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		killGroup(p.pgid, syscall.SIGKILL)
	}
	tag := tagOf(nodes[0].pid)
	if tag != "" {
		if left := sweep(func(v string) bool { return v == tag }); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "recovery: teardown: SIGKILLed %d leftover process(es) of the run: %v\n", len(left), left)
		}
	}
	for _, n := range nodes {
		select {
		case <-n.done:
		case <-time.After(10 * time.Second):
			fmt.Fprintf(os.Stderr, "recovery: launcher %d (pid %d) did not exit after SIGKILL\n", n.idx, n.pid)
		}
		<-waitTimeout(n.logDone, 2*time.Second)
		unregister(n.pid)
	}
}

// ---------------------------------------------------------------------------
// Everything this program started carries tagVar=<benchTag>-... in its
// environment (workers inherit it), and every launcher's group is
// registered, so an interrupt or a failed teardown can still find them.

const tagVar = "RECOVERY_BENCH_TAG"

var benchTag = fmt.Sprintf("recovery-%d-%d", os.Getpid(), time.Now().UnixNano())

var registry = struct {
	sync.Mutex
	tags map[int]string // launcher pid -> run tag
}{tags: map[int]string{}}

func register(tag string, pid int) {
	registry.Lock()
	registry.tags[pid] = tag
	registry.Unlock()
}

func unregister(pid int) {
	registry.Lock()
	delete(registry.tags, pid)
	registry.Unlock()
}

func tagOf(pid int) string {
	registry.Lock()
	defer registry.Unlock()
	return registry.tags[pid]
}

// killEverything SIGKILLs every registered launcher group and every process
// carrying this benchmark's tag.
func killEverything() {
	registry.Lock()
	var pids []int
	for pid := range registry.tags {
		pids = append(pids, pid)
	}
	registry.Unlock()
	for _, pid := range pids {
		for _, p := range descendants(pid) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		killGroup(pid, syscall.SIGKILL)
	}
	if left := sweep(func(v string) bool { return strings.HasPrefix(v, benchTag+"-") }); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "recovery: SIGKILLed %d leftover process(es): %v\n", len(left), left)
	}
}

// sweep SIGKILLs every process (other than us) whose tagVar matches.
func sweep(match func(string) bool) []int {
	var killed []int
	self := os.Getpid()
	for _, p := range procs() {
		if p.pid == self {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.pid))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(b, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte(tagVar+"=")); ok && match(string(v)) {
				if syscall.Kill(p.pid, syscall.SIGKILL) == nil {
					killed = append(killed, p.pid)
				}
				break
			}
		}
	}
	return killed
}

// ---------------------------------------------------------------------------
// Report.

func report(w io.Writer, c config, kinds []launcherKind, res map[string][]result, broken map[string]error) {
	fmt.Fprintf(w, "\n## Recovery after losing 1 of %d nodes\n\n", c.nodes)
	fmt.Fprintf(w, "%d launcher processes on loopback, --nnodes %d:%d, %d gloo worker(s) each (all_reduce every 50 ms), "+
		"c10d rendezvous; one launcher that does not host the store is SIGKILLed with its workers. "+
		"Recovery: kill to every one of the %d surviving ranks running user code (init_process_group returned) in a world of %d. "+
		"Start-up: first launch to the full world of %d running user code.\n\n",
		c.nodes, c.minNodes, c.nodes, c.nproc, (c.nodes-1)*c.nproc, (c.nodes-1)*c.nproc, c.nodes*c.nproc)
	fmt.Fprintln(w, "| launcher | median recovery | min | max | runs recovered | median start-up |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	med := map[string]time.Duration{}
	for _, k := range kinds {
		rs := res[k.name]
		if len(rs) == 0 {
			fmt.Fprintf(w, "| %s | no run measured | | | 0/%d | |\n", k.name, c.runs)
			continue
		}
		var rec, su []time.Duration
		okRuns := 0
		for _, r := range rs {
			su = append(su, r.startup)
			if r.ok() {
				okRuns++
				rec = append(rec, r.recovery)
			} else {
				rec = append(rec, -1) // sorts as +inf
			}
		}
		sortInf(rec)
		m := rec[len(rec)/2]
		med[k.name] = m
		fmt.Fprintf(w, "| %s | %s | %s | %s | %d/%d | %s |\n", k.name, fmtInf(m, c.timeout), fmtInf(rec[0], c.timeout),
			fmtInf(rec[len(rec)-1], c.timeout), okRuns, len(rs), fmtDur(median(su)))
	}
	if a, t := med["ddp-agent"], med["torchrun"]; a > 0 && t > 0 {
		fmt.Fprintf(w, "\nRatio ddp-agent / torchrun, median recovery: %.3f (%.1fx faster)\n", float64(a)/float64(t), float64(t)/float64(a))
	}

	fmt.Fprintf(w, "\nWhere the time goes (medians over the runs, from the kill):\n\n")
	fmt.Fprintln(w, "| launcher | a survivor's collective failed | a launcher noticed | dead node dropped | last call began | round complete | rendezvous done (last survivor) | new workers started (last) | world re-formed |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, k := range kinds {
		rs := res[k.name]
		if len(rs) == 0 {
			fmt.Fprintf(w, "| %s | no run measured | | | | | | | |\n", k.name)
			continue
		}
		col := func(f func(result) time.Duration) string {
			var ds []time.Duration
			for _, r := range rs {
				if d := f(r); d >= 0 {
					ds = append(ds, d)
				}
			}
			if len(ds) == 0 {
				return "-"
			}
			return "+" + fmtDur(median(ds))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", k.name,
			col(func(r result) time.Duration { return r.collFailed }),
			col(func(r result) time.Duration { return r.noticed }),
			col(func(r result) time.Duration { return r.dropped }),
			col(func(r result) time.Duration { return r.lastCall }),
			col(func(r result) time.Duration { return r.complete }),
			col(func(r result) time.Duration { return r.rdzvDone }),
			col(func(r result) time.Duration { return r.spawned }),
			col(func(r result) time.Duration {
				if r.ok() {
					return r.recovery
				}
				return -1
			}))
	}
	for _, k := range kinds {
		if k.name == "torchrun" {
			fmt.Fprintf(w, "\ntorchrun runs with its defaults (PyTorch 1.13): --monitor_interval 5 s; c10d keep-alive every 5 s, "+
				"a node is dead after 3 missed (15 s); last_call_timeout 30 s, join_timeout 600 s, close_timeout 30 s, "+
				"store read_timeout 60 s (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, "+
				"c10d_rendezvous_backend.py; torch/distributed/run.py). LOGLEVEL=%s only makes its log show the phases; "+
				"\"dead node dropped\", \"last call began\" and \"round complete\" come from rdzv_probe.py, which reads the rendezvous state every 50 ms.\n",
				orNone(c.torchrunLogLevel))
		}
	}
	for _, k := range kinds {
		if err := broken[k.name]; err != nil {
			fmt.Fprintf(w, "\n%s: a run could not be measured, its remaining runs were skipped: %v\n", k.name, firstLine(err.Error()))
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "(unset)"
	}
	return s
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " (see above)"
	}
	return s
}

func sortInf(ds []time.Duration) {
	sort.Slice(ds, func(i, j int) bool {
		a, b := ds[i], ds[j]
		if a < 0 {
			return false
		}
		if b < 0 {
			return true
		}
		return a < b
	})
}

func fmtInf(d, timeout time.Duration) string {
	if d < 0 {
		return "> " + timeout.String()
	}
	return fmtDur(d)
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// ---------------------------------------------------------------------------
// Small helpers.

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// waitTimeout returns a channel closed when ch is closed or d has passed.
func waitTimeout(ch <-chan struct{}, d time.Duration) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		defer close(out)
		select {
		case <-ch:
		case <-time.After(d):
		}
	}()
	return out
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
