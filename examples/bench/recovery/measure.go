package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// trial is one run of one launcher kind: its directory, the launchers it
// started, the workers' log, and the probe.
type trial struct {
	c       config
	k       launcherKind
	reap    *reaper
	runIdx  int
	dir     string
	port    int
	id, tag string
	wl      *workerLogReader
	nodes   []*node // the launchers
	helpers []*node // the probe
}

// measure runs one launcher kind once: the full world forms, one launcher
// that does not host the store is killed with its workers, the survivors'
// world forms again; then everything it started is torn down.
func measure(ctx context.Context, c config, reap *reaper, k launcherKind, runIdx int) (res result, err error) {
	res = result{storeHost: -1, victim: -1, victimGR: -1, collFailed: -1, noticed: -1, rdzvDone: -1, spawned: -1,
		dropped: -1, lastCall: -1, complete: -1, lastCallLen: -1}
	dir, err := os.MkdirTemp("", "recovery-bench-"+k.name+"-")
	if err != nil {
		return res, err
	}
	t := &trial{c: c, k: k, reap: reap, runIdx: runIdx, dir: dir}
	defer t.finish(&res, &err)

	if err := t.prepare(); err != nil {
		return res, err
	}
	tLaunch := time.Now()
	if err := t.startNodes(); err != nil {
		return res, err
	}
	formedAt, err := t.waitFormed(ctx)
	if err != nil {
		return res, err
	}
	res.startup = formedAt.Sub(tLaunch)
	if err := t.settle(ctx); err != nil {
		return res, err
	}

	victim, err := t.pickVictim(&res)
	if err != nil {
		return res, err
	}
	probe, probeLog, err := t.startProbe(ctx)
	if err != nil {
		return res, err
	}
	survivors := others(t.nodes, victim)
	t0, err := killNode(victim)
	if err != nil {
		return res, err
	}
	if err := t.waitRecovered(ctx, &res, t0, victim, survivors); err != nil {
		return res, err
	}
	t.breakdown(&res, t0, victim, survivors)
	if probe != nil {
		probeBreakdown(probeLog, t0, &res)
	}
	return res, nil
}

// finish tears the run down and keeps its directory when the run failed, did
// not recover, or -keep; otherwise it removes it.
func (t *trial) finish(res *result, err *error) {
	teardown(append(append([]*node(nil), t.nodes...), t.helpers...), t.c.grace, t.reap)
	if *err != nil || !res.ok() || t.c.keep {
		res.keptDir = t.dir
		if *err != nil {
			*err = fmt.Errorf("%w\n  logs kept in %s", *err, t.dir)
		}
		return
	}
	if rmErr := os.RemoveAll(t.dir); rmErr != nil {
		fmt.Fprintf(os.Stderr, "recovery: remove %s: %v\n", t.dir, rmErr)
	}
}

// prepare chooses the rendezvous port, the run's ids and the workers' log.
func (t *trial) prepare() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	t.port = port
	t.wl = &workerLogReader{path: filepath.Join(t.dir, "workers.jsonl")}
	if err := os.WriteFile(t.wl.path, nil, 0o644); err != nil {
		return err
	}
	t.tag = fmt.Sprintf("%s-%s-%d-%d", t.reap.tag, t.k.name, t.runIdx, port)
	t.id = fmt.Sprintf("bench%d", t.runIdx)
	return nil
}

// startNodes starts the -nodes launchers.
func (t *trial) startNodes() error {
	for i := 0; i < t.c.nodes; i++ {
		n, err := startNode(t.k, t.reap, i, t.dir, t.port, t.id, t.tag, t.wl.path)
		if err != nil {
			return fmt.Errorf("start launcher %d: %w", i, err)
		}
		t.nodes = append(t.nodes, n)
	}
	fmt.Fprintf(os.Stderr, "%-9s run %d: %d launchers up (rendezvous 127.0.0.1:%d, logs %s), waiting for a world of %d\n",
		t.k.name, t.runIdx, t.c.nodes, t.port, t.dir, t.c.nodes*t.c.nproc)
	return nil
}

func startNode(k launcherKind, reap *reaper, idx int, dir string, port int, id, tag, workerLog string) (*node, error) {
	env := append(append([]string(nil), k.env...),
		"RECOVERY_BENCH_LOG="+workerLog,
		"RECOVERY_BENCH_NODE="+strconv.Itoa(idx),
	)
	return startProc(reap, idx, k.argv(port, id), env, tag, filepath.Join(dir, fmt.Sprintf("node%d.log", idx)), k.markers)
}

// exitedErr describes the first of which that exited, with the end of its
// log; nil if none did.
func exitedErr(which []*node) error {
	for _, n := range which {
		if n.exited() {
			<-waitTimeout(n.logDone, time.Second)
			return fmt.Errorf("launcher %d (pid %d) exited: %v; last lines of %s:\n%s", n.idx, n.pid, n.waitErr, n.logPath, n.lastLines())
		}
	}
	return nil
}

// waitFormed waits until the full world runs user code, and returns when
// its last rank got there.
func (t *trial) waitFormed(ctx context.Context) (time.Time, error) {
	full := t.c.nodes * t.c.nproc
	deadline := time.Now().Add(t.c.timeout)
	for {
		if err := t.wl.poll(); err != nil {
			return time.Time{}, err
		}
		if at, ok := t.wl.formed(full, time.Time{}, -1); ok {
			return at, nil
		}
		if err := exitedErr(t.nodes); err != nil {
			return time.Time{}, fmt.Errorf("initial world of %d never formed: %w", full, err)
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("initial world of %d did not form within %v (%d worker lines so far)", full, t.c.timeout, len(t.wl.recs))
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return time.Time{}, err
		}
	}
}

// settle lets the full world run for -settle, and checks it still does.
func (t *trial) settle(ctx context.Context) error {
	if err := sleepCtx(ctx, t.c.settle); err != nil {
		return err
	}
	if err := t.wl.poll(); err != nil {
		return err
	}
	if err := exitedErr(t.nodes); err != nil {
		return fmt.Errorf("the full world broke up before the kill: %w", err)
	}
	return nil
}

// pickVictim picks the launcher that hosts the rendezvous store (-kill
// host), or else the last one that does not, and notes it and the store's
// host in res.
func (t *trial) pickVictim(res *result) (*node, error) {
	host, err := storeHost(t.port, t.nodes)
	if err != nil {
		return nil, err
	}
	res.storeHost = host.idx
	victim := host
	for i := len(t.nodes) - 1; i >= 0 && t.c.kill == "other"; i-- {
		if t.nodes[i] != host {
			victim = t.nodes[i]
			break
		}
	}
	res.victim = victim.idx
	res.victimGR = t.wl.groupRankOf(victim.idx, t.c.nodes*t.c.nproc)
	return victim, nil
}

// startProbe starts rdzv_probe.py for a launcher whose rendezvous it can
// read (and -probe). A probe that does not start only costs the breakdown
// its columns: it returns nil then, and an error only when ctx ended.
func (t *trial) startProbe(ctx context.Context) (probe *node, probeLog string, err error) {
	probeLog = filepath.Join(t.dir, "rdzv.jsonl")
	if !t.k.probe || !t.c.probe {
		return nil, probeLog, nil
	}
	p, perr := startProbe(ctx, t.c, t.reap, t.dir, t.port, t.id, t.tag, probeLog)
	if p != nil {
		t.helpers = append(t.helpers, p)
	}
	switch {
	case ctx.Err() != nil:
		return nil, probeLog, ctx.Err()
	case perr != nil:
		fmt.Fprintf(os.Stderr, "%-9s run %d: no rendezvous probe (the breakdown lacks its columns): %v\n", t.k.name, t.runIdx, perr)
		return nil, probeLog, nil
	}
	return p, probeLog, nil
}

// others is nodes without n.
func others(nodes []*node, n *node) []*node {
	var out []*node
	for _, m := range nodes {
		if m != n {
			out = append(out, m)
		}
	}
	return out
}

// killNode SIGKILLs the launcher, and its workers right after: a dead node
// takes them along. Its process tree is read first, for the workers in
// process groups of their own (ddp-agent's); they would die of their
// parent-death signal anyway, torchrun's would live on as orphans. It
// returns the moment of the kill.
func killNode(victim *node) (time.Time, error) {
	tree := descendants(victim.pid)
	t0 := time.Now()
	if err := syscall.Kill(victim.pid, syscall.SIGKILL); err != nil {
		return t0, fmt.Errorf("kill launcher %d (pid %d): %w", victim.idx, victim.pid, err)
	}
	killGroup(victim.pid, syscall.SIGKILL)
	for _, p := range tree {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		killGroup(p.pgid, syscall.SIGKILL)
	}
	return t0, nil
}

// waitRecovered waits until the survivors' world runs user code, every
// survivor exits, or -timeout passes since t0; res says which.
func (t *trial) waitRecovered(ctx context.Context, res *result, t0 time.Time, victim *node, survivors []*node) error {
	left := (t.c.nodes - 1) * t.c.nproc
	deadline := t0.Add(t.c.timeout)
	for {
		if err := t.wl.poll(); err != nil {
			return err
		}
		if at, ok := t.wl.formed(left, t0, victim.idx); ok {
			res.recovery = at.Sub(t0)
			return nil
		}
		if allExited(survivors) {
			<-waitTimeout(survivors[0].logDone, time.Second)
			res.failed = fmt.Sprintf("every surviving launcher exited; launcher %d: %v, last lines:\n%s",
				survivors[0].idx, survivors[0].waitErr, survivors[0].lastLines())
			return nil
		}
		if time.Now().After(deadline) {
			res.timedOut = true
			return nil
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

func allExited(nodes []*node) bool {
	for _, n := range nodes {
		if !n.exited() {
			return false
		}
	}
	return true
}

// breakdown notes in res where the time went after the kill at t0: the
// workers' lines, then the surviving launchers' log markers.
func (t *trial) breakdown(res *result, t0 time.Time, victim *node, survivors []*node) {
	if at, ok := t.wl.first("fail", t0, victim.idx, -1); ok {
		res.collFailed = at.Sub(t0)
	}
	if at, ok := t.wl.lastOfFirsts("start", (t.c.nodes-1)*t.c.nproc, t0, victim.idx); ok {
		res.spawned = at.Sub(t0)
	}
	var noticed, dropped, rdzv time.Time
	allRdzv := true
	for _, n := range survivors {
		if at, ok := n.eventsAfter(evNoticed, t0); ok && (noticed.IsZero() || at.Before(noticed)) {
			noticed = at
		}
		if at, ok := n.eventsAfter(evDropped, t0); ok && (dropped.IsZero() || at.Before(dropped)) {
			dropped = at
		}
		if at, ok := n.eventsAfter(evRdzvDone, t0); ok {
			if at.After(rdzv) {
				rdzv = at
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
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
