// Command ddp-agent is a node agent for PyTorch DDP jobs: a drop-in
// replacement for torchrun that supervises the workers and explains faults.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent"
	"github.com/ddp-agent/ddp-agent/agent/fault"
	"github.com/ddp-agent/ddp-agent/agent/guard"
	"github.com/ddp-agent/ddp-agent/agent/launch"
	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/agent/placement"
	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// version (the release, the Python package's __version__) and commit (git
// describe) are set at build time with -ldflags "-X main.version=... -X
// main.commit=...", as the Makefile does.
var version, commit = "dev", ""

// versionLine is what `ddp-agent version` prints: the release first, as
// pip and the wheel name it, then where it was built from.
func versionLine(version, commit string) string {
	if commit != "" && commit != version {
		return fmt.Sprintf("ddp-agent %s (%s, %s, %s/%s)", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
	return fmt.Sprintf("ddp-agent %s (%s, %s/%s)", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

const usage = `ddp-agent: a node agent for PyTorch DDP training, in place of torchrun.

Usage:
  ddp-agent run [flags] [--] script.py [args...]   run and supervise this node's workers
  ddp-agent sidecar [flags]                       watch the jobs of another launcher (torchrun, srun) on this node
  ddp-agent status --rdzv-endpoint HOST:PORT      show a multi-node job's nodes and state
  ddp-agent topo [--json]                         show this node's GPUs, their links and CPU/NUMA affinity
  ddp-agent plugins                               list the bundled plugins, their options and versions
  ddp-agent token                                 print a random --rdzv-token (256 bits)
  ddp-agent version                               print the version
  ddp-agent help [command]                        help for a command
`

const tokenUsage = `Usage: ddp-agent token

Prints a random token of 256 bits for --rdzv-token (or $DDP_AGENT_RDZV_TOKEN):
give the same one to every agent of the job, and a new one to each job.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command line and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return runAgent(args[1:], stdout, stderr)
	case "sidecar":
		return runSidecar(args[1:], stdout, stderr)
	case "status":
		return runStatus(args[1:], stdout, stderr)
	case "topo":
		return runTopo(args[1:], stdout, stderr)
	case "plugins":
		return runPlugins(args[1:], stdout, stderr)
	case guard.Command:
		if len(args) != 2 {
			fmt.Fprintf(stderr, "ddp-agent %s: want one instance id\n", guard.Command)
			return 2
		}
		return guard.Run(args[1], os.Stdin, stderr)
	case bindCommand:
		// The NUMA binding trampoline between the agent and a worker: it
		// returns only when it cannot bind or exec.
		err := placement.Exec(args[1:])
		fmt.Fprintf(stderr, "ddp-agent %s: %v\n", bindCommand, err)
		return 127
	case "token":
		if len(args) > 1 {
			fmt.Fprintf(stderr, "ddp-agent token: takes no arguments\n%s", tokenUsage)
			return 2
		}
		fmt.Fprintln(stdout, rdzv.NewToken())
		return 0
	case "version", "--version":
		fmt.Fprintln(stdout, versionLine(version, commit))
		return 0
	case "help", "-h", "--help":
		if len(args) > 1 {
			switch args[1] {
			case "run":
				fmt.Fprint(stdout, launch.Usage())
				return 0
			case "status":
				fmt.Fprint(stdout, statusUsage)
				return 0
			case "sidecar":
				_, _, _ = sidecarFlags([]string{"-h"}, os.Getenv, stdout)
				return 0
			case "topo":
				fmt.Fprint(stdout, topoUsage)
				return 0
			case "plugins":
				fmt.Fprint(stdout, pluginsUsage)
				return 0
			case "token":
				fmt.Fprint(stdout, tokenUsage)
				return 0
			case "version":
				fmt.Fprintln(stdout, "Usage: ddp-agent version\n\nPrints the release of ddp-agent (the Python package's version), the commit\nit was built from and the Go toolchain that built it.")
				return 0
			case "help":
				fmt.Fprint(stdout, usage)
				return 0
			}
			fmt.Fprintf(stderr, "ddp-agent: no help for unknown command %q\n", args[1])
			return 2
		}
		fmt.Fprint(stdout, usage)
		return 0
	}
	if strings.HasPrefix(args[0], "-") {
		// torchrun's habit: flags first, no command.
		fmt.Fprintf(stderr, "ddp-agent: %s is a flag, not a command: did you mean ddp-agent run %s ...?\n", args[0], args[0])
		return 2
	}
	if strings.HasSuffix(args[0], ".py") {
		// torchrun's habit too: the script first, as `torchrun train.py`.
		fmt.Fprintf(stderr, "ddp-agent: %s is a script, not a command: did you mean ddp-agent run %s ...?\n", args[0], args[0])
		return 2
	}
	fmt.Fprintf(stderr, "ddp-agent: unknown command %q (commands: run, sidecar, status, topo, plugins, token, version, help)\n", args[0])
	return 2
}

func runAgent(args []string, stdout, stderr io.Writer) int {
	node := discoverGPUs(context.Background(), os.Getenv)
	defer node.close()
	if node.err != nil {
		fmt.Fprintf(stderr, "ddp-agent run: %v\n", node.err)
		return 2
	}
	cfg, err := launch.Parse(args, os.Getenv, launch.Host{CPUs: runtime.NumCPU(), GPUs: node.visibleGPUs})
	// Read: the secret goes no further, into no worker's or plugin's
	// environment (they inherit the agent's).
	os.Unsetenv(envname.RdzvToken)
	if errors.Is(err, launch.ErrHelp) {
		fmt.Fprint(stdout, launch.Usage())
		return 0
	}
	if c, ok := errors.AsType[*launch.CompletionError](err); ok {
		fmt.Fprint(stdout, c.Script)
		return 0
	}
	if err == nil {
		err = cfg.CheckCommand(launch.Finder{Stat: os.Stat, LookPath: exec.LookPath})
	}
	if err != nil { // a *launch.UsageError: Parse and CheckCommand return nothing else
		fmt.Fprintf(stderr, "ddp-agent run: %v\n", err)
		return 2
	}
	// The workers' torch picks the names of a few variables; one
	// interpreter start, while the GPUs are placed.
	torchVersion := probeTorch(cfg)
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated by Parse
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("component", "ddp-agent")
	gpus, err := node.place(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "ddp-agent run: %v\n", err)
		return 2
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	// Handled, not ignored, so workers still start with SIGPIPE at its
	// default; the agent's own writes to a closed stdout (`| head`, a log
	// shipper gone) then fail with EPIPE instead of killing the agent.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	sigs := make(chan os.Signal, 1)
	// SIGQUIT stops gracefully too, as in torchrun.
	for _, s := range cfg.Signals { // --signals-to-handle
		signal.Notify(sigs, s)
	}
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			cancel(&agent.SignalError{Signal: s.(syscall.Signal)})
		case <-ctx.Done():
			return
		}
		// A second signal means "now": exit at once; the kernel SIGKILLs the
		// workers through their parent-death signal.
		s := <-sigs
		fmt.Fprintf(stderr, "ddp-agent: second %v, exiting without waiting for workers\n", s)
		os.Exit(128 + int(s.(syscall.Signal)))
	}()

	rc := runConfig(cfg, os.Getenv)
	rc.TorchVersion = (<-torchVersion).use(cfg, log)
	rc.GPUs = gpus
	if rc.Spares > 0 {
		rc.SpareEnv = spareEnv(os.Getenv("PYTHONPATH"))
	}
	if f, ok := stderr.(*os.File); ok { // a hang's stacks, readable on a terminal
		rc.Telemetry.Console = observe.Terminal(f)
	}
	defer startGuard(log)()
	a := agent.New(rc, log, supervisor.NewConsole(stdout), supervisor.NewConsole(stderr), workerBaseEnv(os.Environ()))
	err = a.Run(ctx)
	var sigErr *agent.SignalError
	var ended *fault.Error // the fault that ended this node's part, with its severity
	var refused *pluginhost.RefusedError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &sigErr):
		log.Info("agent stopped by signal", "signal", sigErr.Signal.String())
		return 128 + int(sigErr.Signal)
	case errors.As(err, &ended) && ended.Severity == fault.Drain:
		log.Error("node drained", "err", err)
		return exitDrained
	case errors.As(err, &refused):
		fmt.Fprintf(stderr, "ddp-agent run: %v\n", err)
		return 2
	case errors.As(err, &ended):
		log.Error("job failed", "err", err)
		return 1
	case errors.As(context.Cause(ctx), &sigErr):
		// The signal came first, and the error is what it cancelled: a
		// step of the agent's setup, such as dialling the rendezvous
		// store. The exit says the signal, as it does once the job runs.
		log.Info("agent stopped by signal", "signal", sigErr.Signal.String(), "while", err)
		return 128 + int(sigErr.Signal)
	default:
		log.Error("agent error", "err", err)
		return 1
	}
}

// probedTorch is what probeTorch found of the workers' PyTorch.
type probedTorch struct {
	version string
	err     error
}

// probeTorch starts looking for the workers' PyTorch version (one
// interpreter start, while the GPUs are placed).
func probeTorch(cfg *launch.Config) <-chan probedTorch {
	ch := make(chan probedTorch, 1)
	go func() {
		if cfg.NoPython {
			ch <- probedTorch{}
			return
		}
		v, err := supervisor.TorchVersion(context.Background(), cfg.Python, 5*time.Second)
		ch <- probedTorch{v, err}
	}()
	return ch
}

// use returns the version found, and warns when the workers' interpreter
// has no torch: torchrun runs the workers under its own interpreter, and
// ddp-agent from a checkout under python3 from PATH, which may not be the
// job's (a pyenv or conda shim). Said once before every worker fails on
// its import.
func (p probedTorch) use(cfg *launch.Config, log *slog.Logger) string {
	if errors.Is(p.err, supervisor.ErrNoTorch) {
		python, _ := exec.LookPath(cfg.Python)
		log.Warn("the workers' Python finds no torch package: if the script uses PyTorch, give --python (or DDP_AGENT_PYTHON) the interpreter that has it",
			"python", cfg.Python, "path", python)
	}
	return p.version
}

// startGuard starts the guard that kills what the agent started once the
// agent is gone (agent/guard), before the agent starts anything, and
// returns the guard's Close. Without one (no executable to run) the agent
// runs all the same and says so.
func startGuard(log *slog.Logger) func() {
	exe, err := os.Executable()
	var g *guard.Guard
	if err == nil {
		g, err = guard.Start(exe, os.Stderr)
	}
	if err != nil {
		log.Warn("no guard: if this agent is SIGKILLed, what its workers and plugins started may outlive it", "err", err)
	}
	return func() {
		killed, err := g.Close()
		if len(killed) > 0 {
			log.Info("killed what the workers and plugins had left running", "pids", killed)
		}
		if err != nil {
			log.Warn("the agent's processes could not all be killed", "err", err)
		}
	}
}

// exitDrained is the exit code when a GPU fault, a persistent straggler
// under --straggler-action drain, or a detector plugin's drain-node
// finding made this node leave the job:
// the node needs attention before it runs another one.
const exitDrained = 3

// spareEnv is what a warm spare needs beyond a worker's environment: the
// ddp_agent package on PYTHONPATH (after the user's own) when it lies
// beside this executable, as in the wheel (the binary inside the package)
// or the repository (bin/ and python/), since the spare's first import is
// the package, before the script could add it to sys.path itself.
func spareEnv(pythonPath string) []string {
	dir, err := exeDir()
	if err != nil {
		return nil
	}
	for _, root := range []string{filepath.Dir(dir), filepath.Join(filepath.Dir(dir), "python")} {
		if _, err := os.Stat(filepath.Join(root, "ddp_agent", "__init__.py")); err == nil {
			return []string{"PYTHONPATH=" + strings.Trim(pythonPath+string(os.PathListSeparator)+root, string(os.PathListSeparator))}
		}
	}
	return nil
}

// workerBaseEnv is the agent's environment plus DDP_AGENT_SHIM, the
// libddpshim.so next to the ddp-agent executable (as make build lays them
// out), so the workers' ddp_agent package finds the shim that matches this
// agent. A DDP_AGENT_SHIM the user set wins.
func workerBaseEnv(env []string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, envname.Shim+"=") {
			return env
		}
	}
	dir, err := exeDir()
	if err != nil {
		return env
	}
	so := filepath.Join(dir, "libddpshim.so")
	if _, err := os.Stat(so); err != nil {
		return env
	}
	return append(env, envname.Shim+"="+so)
}

// exeDir is the directory of this executable, symlinks resolved: where
// make build and the wheel put the shim and the ddp_agent package.
func exeDir() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	return filepath.Dir(exe), nil
}
