package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// config is the command line.
type config struct {
	agent, python, compat, script string
	nodes, nproc, minNodes, runs  int
	timeout, settle, grace        time.Duration
	only                          string
	keep, probe                   bool
	torchrunLogLevel              string
	kill                          string // "other" or "host"
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

// launcherKind is one launcher under test: how to start a node of it, and
// how to read its log.
type launcherKind struct {
	name    string
	argv    func(port int, id string) []string
	env     []string // added to the launcher's environment
	markers []marker
	probe   bool // rdzv_probe.py can read its rendezvous state (torchrun's c10d)
}

// parseFlags reads the command line; it exits 2 on stray arguments.
func parseFlags() config {
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
	flag.StringVar(&c.kill, "kill", "other", "which launcher is killed: other (one that does not host the rendezvous store) or host (the one that started it)")
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
	if c.kill != "other" && c.kill != "host" {
		fmt.Fprintf(os.Stderr, "recovery: -kill %q: want other or host\n", c.kill)
		os.Exit(2)
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "recovery: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	return c
}

// check validates c and makes its paths absolute; the worker script is
// found from the repository root.
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

// launcherKinds are the launchers -only asks for, ddp-agent first, each
// with the log lines that mark the phases of a recovery.
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
