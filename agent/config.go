package agent

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/join"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// Config is what the agent needs to run this node's part of a job. The
// command line (package launch, torchrun's flags) is mapped onto it by
// cmd/ddp-agent; the agent reads no flag and no environment variable.
type Config struct {
	RunID   string   // the job's id (TORCHELASTIC_RUN_ID); "" makes a random one
	Command []string // one worker's argv: interpreter, script, arguments
	// TorchVersion is the workers' PyTorch version, "" when unknown
	// (supervisor.TorchVersion): it picks torchrun's environment names.
	TorchVersion string
	// SignalsToHandle is --signals-to-handle as the workers are told it
	// (TORCHELASTIC_SIGNALS_TO_HANDLE); "" torchrun's default. The command
	// itself stops the agent on those signals.
	SignalsToHandle string
	NProcPerNode    int
	// VirtualLocalRank: every worker's LOCAL_RANK is 0, and its GPU the
	// only one it sees (GPUs.Virtual).
	VirtualLocalRank bool
	Role             string
	MaxRestarts      int           // restarts of the whole job after a fault
	StopTimeout      time.Duration // grace between SIGTERM and SIGKILL
	// Spares is how many warm spares this node keeps (--spares), started
	// with SpareCommand and SpareEnv added to the workers' environment: a
	// spare takes the rank of a worker that died, and the others keep
	// their processes (spare.go).
	Spares       int
	SpareCommand []string
	SpareEnv     []string
	// StoreCommand, when set, serves the workers' store in a process of
	// its own while this node is group rank 0, so that rank 0's worker
	// can die and a spare take its place (supervisor/store.go); SpareEnv
	// is added to its environment. Set with Spares.
	StoreCommand []string

	// LogDir keeps each run's worker logs, error files and Perfetto
	// traces in LogDir/<run id>. Without it, KeepLogs keeps them in a
	// temporary directory (--redirects or --tee ask for files), and
	// otherwise the run's directory is removed at exit.
	LogDir   string
	KeepLogs bool
	// Streams says where each local rank's stdout and stderr go; nil: the
	// console only.
	Streams func(localRank int) supervisor.Streams

	Rendezvous Rendezvous
	Telemetry  Telemetry
	Plugins    Plugins
	// GPUs is this node's GPUs; nil runs a CPU-only node: no placement,
	// no binding, no health watch.
	GPUs *GPUs
}

// Rendezvous says how this node joins the job: its Backend, chosen once
// from the command line, and that backend's settings (join.Config).
type Rendezvous = join.Config

// Telemetry says what the agent watches in the workers' collectives and
// where it exports it (observe.Config, the sidecar's too), and what it
// does about a persistent straggler.
type Telemetry struct {
	observe.Config
	// StragglerAction is what is done about a persistent straggler named
	// without a gap for StragglerConfirm; "": straggler.ActionLog.
	StragglerAction straggler.Action
	// StragglerConfirm is the confirmation window; 0:
	// straggler.DefaultConfirm.
	StragglerConfirm time.Duration
}

func (c *Config) nnodes() string {
	r := c.Rendezvous
	if r.NNodesMin == r.NNodesMax {
		return strconv.Itoa(r.NNodesMax)
	}
	return strconv.Itoa(r.NNodesMin) + ":" + strconv.Itoa(r.NNodesMax)
}

// check reports a configuration the agent cannot run: the command line
// never makes one (package launch validates the flags), a caller of
// package agent might.
func (c *Config) check() error {
	r := c.Rendezvous
	switch {
	case len(c.Command) == 0:
		return errors.New("agent config: no worker command")
	case c.NProcPerNode < 1:
		return errors.New("agent config: NProcPerNode must be at least 1")
	case c.Spares < 0 || (c.Spares > 0 && len(c.SpareCommand) == 0):
		return errors.New("agent config: Spares needs a SpareCommand, and must not be negative")
	case r.NNodesMin < 1 || r.NNodesMax < r.NNodesMin:
		return errors.New("agent config: want 1 <= NNodesMin <= NNodesMax")
	case r.Backend.UsesStore() && len(r.Endpoints) == 0:
		return errors.New("agent config: a dynamic rendezvous needs the store's endpoints")
	case c.Telemetry.StragglerAction != "" && !c.Telemetry.StragglerAction.Valid():
		return fmt.Errorf("agent config: StragglerAction %q is not one of %v", c.Telemetry.StragglerAction, straggler.Actions)
	case c.Telemetry.StragglerConfirm < 0:
		return errors.New("agent config: StragglerConfirm must not be negative")
	}
	return nil
}

// Plugins says which plugins run beside the job.
type Plugins struct {
	Specs []pluginhost.Spec
	Dir   string // where the bundled plugins' binary is; "": next to the executable
}
