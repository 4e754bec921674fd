package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Everything this program started carries tagVar=<reaper tag>-... in its
// environment (workers inherit it), and every launcher's group is
// registered with the reaper, so an interrupt or a failed teardown can
// still find them.

const tagVar = "RECOVERY_BENCH_TAG"

// reaper knows the launchers this program started, and the tag every
// process it started carries. It is safe to use concurrently: the signal
// handler's killEverything races the runs.
type reaper struct {
	tag string // this program's: recovery-<pid>-<start ns>

	mu   sync.Mutex
	tags map[int]string // launcher pid -> run tag
}

func newReaper() *reaper {
	return &reaper{
		tag:  fmt.Sprintf("recovery-%d-%d", os.Getpid(), time.Now().UnixNano()),
		tags: map[int]string{},
	}
}

func (r *reaper) register(tag string, pid int) {
	r.mu.Lock()
	r.tags[pid] = tag
	r.mu.Unlock()
}

func (r *reaper) unregister(pid int) {
	r.mu.Lock()
	delete(r.tags, pid)
	r.mu.Unlock()
}

// killEverything SIGKILLs every registered launcher group and every process
// carrying this benchmark's tag.
func (r *reaper) killEverything() {
	r.mu.Lock()
	var pids []int
	for pid := range r.tags {
		pids = append(pids, pid)
	}
	r.mu.Unlock()
	for _, pid := range pids {
		for _, p := range descendants(pid) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		killGroup(pid, syscall.SIGKILL)
	}
	if left := sweep(func(v string) bool { return strings.HasPrefix(v, r.tag+"-") }); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "recovery: SIGKILLed %d leftover process(es): %v\n", len(left), left)
	}
}

// teardown stops every launcher of a run and everything they started:
// SIGTERM to each process group, SIGKILL after grace, then SIGKILL to any
// process that still carries the run's tag in its environment.
func teardown(nodes []*node, grace time.Duration, reap *reaper) {
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
	tag := nodes[0].tag
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
		reap.unregister(n.pid)
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
