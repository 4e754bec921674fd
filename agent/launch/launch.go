// Package launch turns a torchrun-style command line into a launch Config.
//
// Every torchrun flag is accepted under both spellings (--nproc-per-node and
// --nproc_per_node), and, as in torchrun, each flag's default may come from a
// PET_<NAME> environment variable, so a torchrun command line keeps its meaning
// after the program name is swapped for `ddp-agent run`.
package launch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
)

// Std selects which of a worker's standard streams a --redirects or --tee
// setting applies to. The values are torchrun's.
type Std uint8

const (
	StdNone Std = 0
	StdOut  Std = 1
	StdErr  Std = 2
	StdAll  Std = 3
)

// Has reports whether s includes the stream o (StdOut or StdErr).
func (s Std) Has(o Std) bool { return s&o != 0 }

// StdSpec is a --redirects or --tee value: one Std for every local rank
// ("3"), or one per local rank ("0:1,1:3"); ranks not named get StdNone.
type StdSpec struct {
	All     Std
	PerRank map[int]Std
}

// For returns the setting for local rank r.
func (s StdSpec) For(r int) Std {
	if s.PerRank != nil {
		return s.PerRank[r]
	}
	return s.All
}

// Any reports whether the setting applies to any stream of any rank.
func (s StdSpec) Any() bool {
	if s.All != StdNone {
		return true
	}
	for _, v := range s.PerRank {
		if v != StdNone {
			return true
		}
	}
	return false
}

func parseStd(v string) (StdSpec, error) {
	one := func(s string) (Std, error) {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 || n > 3 {
			return 0, fmt.Errorf("%q is not one of 0 (none), 1 (stdout), 2 (stderr), 3 (both)", s)
		}
		return Std(n), nil
	}
	if !strings.Contains(v, ":") {
		s, err := one(v)
		return StdSpec{All: s}, err
	}
	spec := StdSpec{PerRank: map[int]Std{}}
	for _, part := range strings.Split(v, ",") {
		r, s, ok := strings.Cut(part, ":")
		rank, err := strconv.Atoi(strings.TrimSpace(r))
		if !ok || err != nil || rank < 0 {
			return StdSpec{}, fmt.Errorf("%q is not LOCAL_RANK:VALUE", part)
		}
		if spec.PerRank[rank], err = one(s); err != nil {
			return StdSpec{}, err
		}
	}
	return spec, nil
}

// Config is a parsed `ddp-agent run` command line.
type Config struct {
	NProcPerNode int    // workers on this node
	NProcSpec    string // as given: a number, auto, cpu or gpu
	// NProcLimit is the most workers this node may run: --max-nproc-per-node,
	// or DefaultNProcLimit of the host.
	NProcLimit int
	// NUMABinding is --numa-binding: none, node or exclusive; "" when not
	// given, which means node on a node with NVML and none without.
	NUMABinding string
	NNodesMin   int
	NNodesMax   int
	NodeRank    int
	Standalone  bool

	RdzvBackend  string
	RdzvEndpoint string
	RdzvID       string // also the run id (TORCHELASTIC_RUN_ID)
	RdzvConf     string // as given
	RdzvToken    string // shared secret checked on join; "" = none
	Rdzv         RdzvConf

	MasterAddr string
	MasterPort int // 0: pick a free port for every attempt

	MaxRestarts     int
	Spares          int           // warm spare workers (SpareCommand)
	MonitorInterval time.Duration // accepted for torchrun compatibility; exits are noticed without polling
	StopTimeout     time.Duration // grace between SIGTERM and SIGKILL
	StartMethod     string
	Role            string
	LocalAddr       string

	LogDir    string
	Redirects StdSpec
	Tee       StdSpec

	Module   bool
	NoPython bool
	Python   string // interpreter for the script, unless NoPython

	LogLevel string // debug, info, warn, error

	// Stalls and traces.
	HangTimeout  time.Duration // a collective unfinished this long after the first rank arrived is a hang; 0: no hang detection
	HangAuto     bool          // --hang-timeout auto: HangTimeout, or 10 × the median step time when longer
	OTelEndpoint string        // OTLP collector; "" leaves it to the OTEL_* variables
	TraceSample  float64       // share of normal steps traced; stalled steps always are
	MetricsAddr  string        // Prometheus endpoint; "" none
	// MetricsLinger bounds the wait at the job's end for a scraper to read
	// the last state (observe.Config.MetricsLinger).
	MetricsLinger time.Duration
	// StragglerCost: a persistent straggler is named only when the waits it
	// causes cost at least this share of step time.
	StragglerCost float64
	// StragglerAction is what is done about a persistent straggler named
	// without a gap for StragglerConfirm: log, restart or drain.
	StragglerAction  string
	StragglerConfirm time.Duration

	// LocalRanksFilter, when set, names the local ranks whose output is
	// shown on the console (--local-ranks-filter); nil shows every rank's.
	LocalRanksFilter map[int]bool
	// LinePrefix is --log-line-prefix-template ("" the default).
	LinePrefix string
	// DupOut and DupErr are --duplicate-stdout-filters and
	// --duplicate-stderr-filters.
	DupOut, DupErr []string

	// Signals stop the agent (--signals-to-handle).
	Signals []syscall.Signal
	// VirtualLocalRank: every worker sees LOCAL_RANK=0 and its GPU alone.
	VirtualLocalRank bool

	// Plugins are the --plugin specs (or $DDP_AGENT_PLUGINS's).
	Plugins []pluginhost.Spec

	Script     string
	ScriptArgs []string
}

// Command is the argv of one worker, as torchrun builds it: the interpreter
// with -u (unbuffered, so output reaches the log at once), then the script or
// -m module, then the script's arguments.
func (c *Config) Command() []string {
	var argv []string
	switch {
	case c.NoPython:
		argv = []string{c.Script}
	case c.Module:
		argv = []string{c.Python, "-u", "-m", c.Script}
	case strings.HasPrefix(c.Script, "-"):
		// Python would take "-x.py" for its option -x.
		argv = []string{c.Python, "-u", "./" + c.Script}
	default:
		argv = []string{c.Python, "-u", c.Script}
	}
	return append(argv, c.ScriptArgs...)
}

// SpareCommand is the argv of a warm spare: the interpreter runs
// ddp_agent's spare, which imports what the script imports and waits to
// run it as a worker (python/ddp_agent/_spare.py).
func (c *Config) SpareCommand() []string {
	argv := []string{c.Python, "-u", "-m", "ddp_agent._spare"}
	if c.Module {
		argv = append(argv, "-m")
	}
	return append(append(argv, c.Script), c.ScriptArgs...)
}

// StoreCommand is the argv of the process that serves the workers'
// store under --spares: torch's own TCPStore, in the workers' interpreter
// (python/ddp_agent/_store.py).
func (c *Config) StoreCommand() []string {
	return []string{c.Python, "-u", "-m", "ddp_agent._store"}
}

// Host is what Parse needs to know about this machine to resolve
// --nproc-per-node auto|cpu|gpu.
type Host struct {
	CPUs int
	// GPUs counts the GPUs visible to workers; an error means none can be found.
	GPUs func() (int, error)
}

// ErrHelp is returned by Parse when the command line asks for help.
var ErrHelp = errors.New("help requested")

// UsageError is a command line that cannot be run: an unknown flag, a bad
// value, or flags that contradict each other. The agent exits with code 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

func usagef(format string, a ...any) error { return &UsageError{Msg: fmt.Sprintf(format, a...)} }

// rawFlags holds the flag values as strings before validation, so a value
// from the command line and one from a PET_ variable go through the same checks.
type rawFlags map[string]string

// flagSpec describes one flag; name is the canonical dashed spelling.
type flagSpec struct {
	name  string
	short string
	bool  bool
	def   string
	help  string
	// exact: the flag is ddp-agent's own and matches only when spelled
	// out, so that it never makes one of torchrun's prefixes ambiguous
	// (--max still means --max-restarts).
	exact bool
	// repeat: every use counts (--plugin a --plugin b), not only the last.
	repeat bool
}

var flagSpecs = []flagSpec{
	{name: "nproc-per-node", def: "1", help: "workers per node: a number, auto (one per GPU, else one per CPU), cpu, or gpu"},
	{name: "max-nproc-per-node", exact: true, help: "refuse a --nproc-per-node above this (default: 4 workers per CPU or GPU, whichever is more, and at least 32); a bound against a typo forking the node to death"},
	{name: "numa-binding", help: "bind each worker to the CPUs and memory of its GPU's NUMA node: none, node (the node's CPUs, memory preferred there), or exclusive (a disjoint share of the node's cores, memory bound there); default node when NVML finds GPUs, none otherwise"},
	{name: "nnodes", def: "1", help: "number of nodes, or MIN:MAX for an elastic job"},
	{name: "node-rank", def: "0", help: "rank of this node (static rendezvous only)"},
	{name: "standalone", bool: true, help: "single-node job: no rendezvous store (the node's state and the workers' key-value store live in the agent), the workers' master on a free loopback port"},
	{name: "rdzv-backend", def: "static", help: "static (fixed nodes, no store), c10d (the agent at --rdzv-endpoint hosts an embedded etcd), or etcd (an existing etcd cluster)"},
	{name: "rdzv-endpoint", help: "rendezvous store host:port (c10d default port 29400), or a comma-separated list of etcd members (etcd default port 2379)"},
	{name: "rdzv-id", help: "job id shared by all nodes; also TORCHELASTIC_RUN_ID"},
	{name: "run-id", help: "same as --rdzv-id"},
	{name: "rdzv-conf", help: "rendezvous settings key1=value1,key2=value2: join_timeout, last_call_timeout, keep_alive_interval, keep_alive_max_attempt, is_host, cacert, cert, key, protocol, etcd_prefix, store_quota (see docs/rendezvous.md)"},
	{name: "rdzv-token", help: "shared secret every agent of the job must give (default $DDP_AGENT_RDZV_TOKEN)"},
	{name: "master-addr", help: "address of the rank 0 node, static rendezvous (default 127.0.0.1)"},
	{name: "master-port", help: "port for the workers' store (default: a free port for each attempt; 29500 for a static multi-node job)"},
	{name: "max-restarts", def: "0", help: "restarts of the job after faults (worker failures, lost nodes) before it fails; scale events do not count"},
	{name: "spares", def: "0", help: "warm spare workers on this node for scripts that use ddp_agent.InProcess: each imports torch and the script's modules, then waits; when a worker dies (a signal: SIGKILL, the OOM killer), a spare takes its rank and the other workers keep their processes (docs/in-process.md); rank 0's too, as the agent then serves the workers' store; not with --no-python"},
	{name: "monitor-interval", def: "5", help: "accepted for torchrun compatibility; worker exits are noticed at once"},
	{name: "stop-timeout", def: "10s", help: "grace period between SIGTERM and SIGKILL when stopping workers"},
	{name: "shutdown-timeout", help: "torchrun 2.x's name for --stop-timeout (seconds)"},
	{name: "event-log-handler", def: "null", help: "accepted for torchrun compatibility: null or console (the agent logs its events, and exports them through OpenTelemetry)"},
	{name: "logs-specs", help: "torchrun's Python plugin for the log layout: not supported (the layout is --log-dir's)"},
	{name: "start-method", def: "spawn", help: "accepted for torchrun compatibility: spawn, fork or forkserver"},
	{name: "role", def: "default", help: "user-defined role of the workers"},
	{name: "local-addr", help: "address other nodes reach this one at (default: the address this host uses to reach the rendezvous store)"},
	{name: "hang-timeout", def: "60s", help: "a gradient all-reduce not finished this long after the first rank arrived is a hang: the agent reports who never arrived (with their Python stacks), aborts and restarts the job; auto: 60s, or 10 times the median step time when that is longer; 0 disables"},
	{name: "otel-endpoint", help: "OpenTelemetry collector for traces and metrics (host:port for OTLP/gRPC, or an http:// URL for OTLP/HTTP); default: the OTEL_EXPORTER_OTLP_* variables; without one, a Perfetto trace file per generation in the log dir"},
	{name: "trace-sample", def: "0.1", help: "share of normal training steps traced (0 to 1); steps with a stall or hang are always traced"},
	{name: "metrics-addr", help: "serve Prometheus metrics at this address (e.g. :9464); default none"},
	{name: "metrics-linger", exact: true, def: "60s", help: "at the job's end, keep the metrics endpoint up until a scraper that read it before reads the last state, at most this long (not after a signal); 0 closes it at once"},
	{name: "straggler-cost", def: "0.05", help: "name a persistent straggler only when the waits it causes cost at least this share of step time (0 to 1, exclusive)"},
	{name: "straggler-action", def: "log", help: "what to do about a persistent straggler named without a gap for --straggler-confirm: log (a line, nothing more), restart (restart the job, counted against --max-restarts; not when none are left), or drain (the node that runs the straggler leaves the job, when at least MIN nodes remain or a spare waits)"},
	{name: "straggler-confirm", def: "60s", help: "how long a rank must stay a persistent straggler, without a gap, before --straggler-action acts (seconds, or like 90s; above 0)"},
	{name: "plugin", exact: true, repeat: true, help: "run a plugin beside the job, repeatable: NAME[,key=value...] for a bundled one (exec, nic, disk, webhook; see ddp-agent plugins) or /path/to/plugin[,key=value...]; default $DDP_AGENT_PLUGINS (specs separated by ';')"},
	{name: "signals-to-handle", def: "SIGTERM,SIGINT,SIGHUP,SIGQUIT", help: "signals that stop the agent and its workers, as torchrun >= 2.8: comma-separated names from SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU; the workers get SIGINT for SIGINT, SIGTERM for SIGTERM, SIGHUP and SIGQUIT, and any other as it is (SIGUSR1: Slurm's warning before the time limit), then SIGKILL after --stop-timeout"},
	{name: "virtual-local-rank", bool: true, help: "every worker sees LOCAL_RANK=0 and only its own GPU in CUDA_VISIBLE_DEVICES (device 0), as torchrun >= 2.8; needs a GPU per worker"},
	{name: "log-dir", help: "directory for per-rank stdout/stderr files, kept per attempt"},
	{name: "redirects", short: "r", def: "0", help: "streams sent only to log files: 0 none, 1 stdout, 2 stderr, 3 both, or 0:1,1:2 per local rank"},
	{name: "tee", short: "t", def: "0", help: "streams sent to log files and the console, same values as --redirects"},
	{name: "local-ranks-filter", help: "show only these local ranks' output on the console, e.g. 0 or 0,2 (log files keep every rank's), as torchrun >= 2.2"},
	{name: "duplicate-stdout-filters", help: "also append the stdout lines that hold one of these strings (comma-separated; ,, for a comma) to filtered_stdout.log in the attempt's log directory, every rank's, prefixed, as torchrun >= 2.8"},
	{name: "duplicate-stderr-filters", help: "the same for stderr, into filtered_stderr.log"},
	{name: "log-line-prefix-template", help: "what goes before each worker line on the console, with the macros ${role_name}, ${local_rank}, ${rank}, ${hostname} (default [rank${rank}]:)"},
	{name: "module", short: "m", bool: true, help: "run the script as a Python module (python -m)"},
	{name: "no-python", bool: true, help: "run the script directly, not through the Python interpreter"},
	{name: "run-path", bool: true, help: "accepted for torchrun compatibility: the script runs as python -u script.py either way"},
	{name: "python", def: "python3", help: "Python interpreter for the workers (env DDP_AGENT_PYTHON, or PYTHON_EXEC as with torchrun); the ddp-agent command that pip installs defaults to the interpreter it was installed with"},
	{name: "print-completion", help: "print a completion script for bash, zsh or tcsh and exit (ddp-agent run --print-completion bash >> ~/.bashrc), as torchrun >= 2.9"},
	{name: "log-level", def: "info", help: "agent log level: debug, info, warn, error"},
	{name: "use-env", bool: true, help: "accepted for compatibility with torch.distributed.launch; always on"},
}

// lookupFlag finds the flag an argument names: an exact spelling, or, as
// argparse allows, an unambiguous prefix of one (--nproc).
func lookupFlag(arg string) (*flagSpec, error) {
	var prefixed []*flagSpec
	for i := range flagSpecs {
		f := &flagSpecs[i]
		dashed, underscored := "--"+f.name, "--"+strings.ReplaceAll(f.name, "-", "_")
		if arg == dashed || arg == underscored || (f.short != "" && arg == "-"+f.short) {
			return f, nil
		}
		if !f.exact && strings.HasPrefix(arg, "--") && len(arg) > 2 && (strings.HasPrefix(dashed, arg) || strings.HasPrefix(underscored, arg)) {
			prefixed = append(prefixed, f)
		}
	}
	switch len(prefixed) {
	case 1:
		return prefixed[0], nil
	case 0:
		return nil, usagef("unknown flag %s (see ddp-agent help run)", arg)
	}
	names := make([]string, len(prefixed))
	for i, f := range prefixed {
		names[i] = "--" + f.name
	}
	return nil, usagef("ambiguous flag %s could be %s", arg, strings.Join(names, ", "))
}

// Parse reads a `ddp-agent run` command line (without the subcommand).
// getenv supplies PET_* defaults and DDP_AGENT_PYTHON. It returns ErrHelp
// for -h/--help and a *UsageError for anything that cannot be run.
func Parse(args []string, getenv func(string) string, host Host) (*Config, error) {
	raw, set, fromEnv := fromEnvironment(getenv)
	took := "" // the last flag that took the next argument as its value
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if a == "-h" || a == "--help" {
			return nil, ErrHelp
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			break
		}
		name, val, hasVal := strings.Cut(a, "=")
		if len(a) > 2 && a[1] != '-' && !hasVal { // -r3, -t0:1: a short flag with its value attached
			name, val, hasVal = a[:2], a[2:], true
		}
		f, err := lookupFlag(name)
		if err != nil {
			return nil, err
		}
		if f.name == "print-completion" {
			if !hasVal && i+1 < len(args) {
				val = args[i+1]
			}
			script, err := completion(val)
			if err != nil {
				return nil, err
			}
			return nil, &CompletionError{Script: script}
		}
		again := set[f.name]
		fromEnv[f.name] = false           // given here, not by the environment alone (dropEnvOnly)
		set[f.name] = true                // given twice: the last one wins, as with argparse
		if f.repeat && again && !f.bool { // ... unless it is one of ddp-agent's repeatable ones
			if !hasVal {
				if i+1 >= len(args) {
					return nil, usagef("flag --%s needs a value", f.name)
				}
				i++
				val = args[i]
			}
			raw[f.name] += "\n" + val
			continue
		}
		switch {
		case f.bool && hasVal:
			return nil, usagef("--%s takes no value, got %q", f.name, val)
		case f.bool:
			raw[f.name] = "true"
		case hasVal:
			raw[f.name] = val
		default:
			if i+1 >= len(args) {
				return nil, usagef("flag --%s needs a value", f.name)
			}
			i++
			raw[f.name] = args[i]
			took = f.name
		}
	}
	if i >= len(args) {
		if took != "" && strings.HasSuffix(raw[took], ".py") {
			// --nproc-per-node train.py: the flag's value forgotten.
			return nil, usagef("missing the training script: --%s took %s as its value (ddp-agent run [flags] script.py [args...])", took, raw[took])
		}
		return nil, usagef("missing the training script (ddp-agent run [flags] script.py [args...])")
	}
	c := &Config{Script: args[i], ScriptArgs: append([]string(nil), args[i+1:]...)}
	raw.dropEnvOnly(set, fromEnv)
	if err := raw.fill(c, set, host); err != nil {
		return nil, err
	}
	return c, nil
}

func (r rawFlags) bool(name string) (bool, error) {
	if r[name] == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(r[name])
	if err != nil {
		return false, usagef("--%s: %q is not a boolean (PET_%s takes 1 or 0)", name, r[name], strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	}
	return b, nil
}

func (r rawFlags) int(name string, min int) (int, error) {
	n, err := strconv.Atoi(r[name])
	if err != nil || n < min {
		return 0, usagef("--%s must be an integer >= %d, got %q", name, min, r[name])
	}
	return n, nil
}

// spares is --spares, for a Python script only: a spare imports it.
func (r rawFlags) spares(noPython bool) (int, error) {
	n, err := r.int("spares", 0)
	if err == nil && n > 0 && noPython {
		return 0, usagef("--spares needs a Python script: a spare imports it, and --no-python runs a program")
	}
	return n, err
}

// seconds parses a duration given as torchrun does (plain seconds) or as a Go
// duration ("500ms", "1m").
func (r rawFlags) seconds(name string) (time.Duration, error) {
	d, err := observe.Seconds(name, r[name])
	if err != nil {
		return 0, usagef("%v", err)
	}
	return d, nil
}

func (r rawFlags) fill(c *Config, set map[string]bool, host Host) error {
	var err error
	for name, dst := range map[string]*bool{"standalone": &c.Standalone, "module": &c.Module, "no-python": &c.NoPython, "run-path": new(bool), "use-env": new(bool)} {
		if *dst, err = r.bool(name); err != nil {
			return err
		}
	}
	if c.Module && c.NoPython {
		return usagef("--module and --no-python contradict each other: a module needs the Python interpreter")
	}
	if c.NNodesMin, c.NNodesMax, err = parseNNodes(r["nnodes"]); err != nil {
		return err
	}
	if c.NodeRank, err = r.int("node-rank", 0); err != nil {
		return err
	}
	if err := r.nproc(c, host); err != nil {
		return err
	}
	switch c.NUMABinding = r["numa-binding"]; c.NUMABinding {
	case "", "none", "node", "exclusive":
	default:
		return usagef("--numa-binding %q is not one of none, node, exclusive", c.NUMABinding)
	}
	if c.MaxRestarts, err = r.int("max-restarts", 0); err != nil {
		return err
	}
	if c.Spares, err = r.spares(c.NoPython); err != nil {
		return err
	}
	if err := r.telemetry(c); err != nil {
		return err
	}
	if err := r.plugins(c); err != nil {
		return err
	}
	if err := r.stragglers(c); err != nil {
		return err
	}
	if c.MonitorInterval, err = r.seconds("monitor-interval"); err != nil {
		return err
	}
	if err := r.stopTimeout(c, set); err != nil {
		return err
	}
	if err := r.signalsAndRanks(c, host); err != nil {
		return err
	}
	if err := r.torchrunOnly(); err != nil {
		return err
	}
	c.RdzvBackend = r["rdzv-backend"]
	switch c.RdzvBackend {
	case "static", "c10d", "etcd", "etcd-v2":
	default:
		return usagef("--rdzv-backend %q is not one of static, c10d, etcd", c.RdzvBackend)
	}
	c.RdzvEndpoint, c.RdzvConf = r["rdzv-endpoint"], r["rdzv-conf"]
	if err := r.runID(c); err != nil {
		return err
	}
	c.MasterAddr = r["master-addr"]
	if p := r["master-port"]; p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return usagef("--master-port must be a port number 1..65535, got %q", p)
		}
		c.MasterPort = n
	}
	if c.Standalone && (set["master-addr"] || set["master-port"]) { // on the command line (Parse drops PET_MASTER_*)
		// torchrun's --standalone picks its own port; a fixed one would be silently ignored there.
		return usagef("--standalone picks a free master port itself; drop --master-addr/--master-port, or drop --standalone")
	}
	c.RdzvToken = r["rdzv-token"]
	if err := rdzv.CheckToken(c.RdzvToken); err != nil {
		return usagef("%v", err)
	}
	if c.Rdzv, err = parseRdzvConf(c.RdzvConf); err != nil {
		return err
	}
	if err := c.checkRendezvous(set); err != nil {
		return err
	}
	c.StartMethod = r["start-method"]
	switch c.StartMethod {
	case "spawn", "fork", "forkserver":
	default:
		return usagef("--start-method %q is not one of spawn, fork, forkserver", c.StartMethod)
	}
	if c.Role = r["role"]; c.Role == "" {
		return usagef("--role must not be empty")
	}
	c.LocalAddr = r["local-addr"]
	if err := r.logDir(c); err != nil {
		return err
	}
	if err := r.console(c); err != nil {
		return err
	}
	if c.Python = r["python"]; c.Python == "" && !c.NoPython {
		return usagef("--python must not be empty")
	}
	c.LogLevel = r["log-level"]
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return usagef("--log-level %q is not one of debug, info, warn, error", c.LogLevel)
	}
	return nil
}

// telemetry reads the telemetry options with observe's parsers, as the
// sidecar's flags are: one meaning for both modes.
func (r rawFlags) telemetry(c *Config) (err error) {
	if c.HangTimeout, c.HangAuto, err = observe.ParseHangTimeout(r["hang-timeout"]); err != nil {
		return usagef("%v", err)
	}
	c.OTelEndpoint, c.MetricsAddr = r["otel-endpoint"], r["metrics-addr"]
	if err := observe.CheckMetricsAddr(c.MetricsAddr); err != nil {
		return usagef("%v", err)
	}
	if err := observe.CheckOTelEndpoint(c.OTelEndpoint); err != nil {
		return usagef("%v", err)
	}
	if c.MetricsLinger, err = r.seconds("metrics-linger"); err != nil {
		return err
	}
	if c.TraceSample, err = observe.ParseTraceSample(r["trace-sample"]); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// runID reads --rdzv-id, or --run-id, its other name.
func (r rawFlags) runID(c *Config) error {
	c.RdzvID = r["rdzv-id"]
	if runID := r["run-id"]; runID != "" {
		if c.RdzvID != "" && c.RdzvID != runID {
			return usagef("--run-id %q and --rdzv-id %q differ; give one of them", runID, c.RdzvID)
		}
		c.RdzvID = runID
	}
	if c.RdzvID == "none" { // torchrun's default spelling of "not set"
		c.RdzvID = ""
	}
	// Under every backend: the id names the run's log directory too, and
	// "../x" wrote outside --log-dir where no store checked it.
	if c.RdzvID != "" {
		if err := rdzv.CheckID(c.RdzvID); err != nil {
			return usagef("--rdzv-id: %v", err)
		}
	}
	return nil
}

// stopTimeout reads --stop-timeout, or torchrun 2.x's --shutdown-timeout.
func (r rawFlags) stopTimeout(c *Config, set map[string]bool) error {
	name := "stop-timeout"
	if set["shutdown-timeout"] {
		if set["stop-timeout"] {
			return usagef("--shutdown-timeout and --stop-timeout name the same grace period; give one of them")
		}
		name = "shutdown-timeout"
	}
	var err error
	c.StopTimeout, err = r.seconds(name)
	return err
}

// SignalsToHandle is --signals-to-handle as the workers are told it
// (TORCHELASTIC_SIGNALS_TO_HANDLE): the signals' names, comma-separated.
func (c *Config) SignalsToHandle() string {
	names := make([]string, len(c.Signals))
	for i, sig := range c.Signals {
		for name, s := range handledSignals {
			if s == sig {
				names[i] = name
			}
		}
	}
	return strings.Join(names, ",")
}

// handledSignals are the signals --signals-to-handle may name: those that
// can ask a job to stop. SIGKILL and SIGSTOP cannot be caught, and the
// agent needs SIGCHLD and SIGPIPE for themselves.
var handledSignals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT, "SIGHUP": syscall.SIGHUP, "SIGQUIT": syscall.SIGQUIT,
	"SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGALRM": syscall.SIGALRM, "SIGXCPU": syscall.SIGXCPU,
}

// signalsAndRanks reads --signals-to-handle and --virtual-local-rank.
func (r rawFlags) signalsAndRanks(c *Config, host Host) error {
	c.Signals = nil
	for _, name := range strings.Split(r["signals-to-handle"], ",") {
		name = strings.TrimSpace(name)
		sig, ok := handledSignals[name]
		if !ok {
			return usagef("--signals-to-handle: %q is not one of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU", name)
		}
		if !slices.Contains(c.Signals, sig) {
			c.Signals = append(c.Signals, sig)
		}
	}
	var err error
	if c.VirtualLocalRank, err = r.bool("virtual-local-rank"); err != nil {
		return err
	}
	if c.VirtualLocalRank && host.GPUs != nil {
		if n, err := host.GPUs(); err == nil && n > 0 && c.NProcPerNode > n {
			return usagef("--virtual-local-rank gives each worker a GPU of its own: %d workers, %d GPUs", c.NProcPerNode, n)
		}
	}
	return nil
}

// console reads where the workers' output goes: --redirects, --tee,
// --local-ranks-filter and --log-line-prefix-template.
func (r rawFlags) console(c *Config) error {
	var err error
	if c.Redirects, err = parseStd(r["redirects"]); err != nil {
		return usagef("--redirects: %v", err)
	}
	if c.Tee, err = parseStd(r["tee"]); err != nil {
		return usagef("--tee: %v", err)
	}
	if c.LocalRanksFilter, err = parseRanks(r["local-ranks-filter"]); err != nil {
		return usagef("--local-ranks-filter: %v", err)
	}
	c.LinePrefix = r["log-line-prefix-template"]
	c.DupOut, c.DupErr = parseFilters(r["duplicate-stdout-filters"]), parseFilters(r["duplicate-stderr-filters"])
	return nil
}

// parseFilters reads torchrun's comma-separated list, where ",," is a
// comma; empty entries are dropped.
func parseFilters(v string) []string {
	const comma = "\x00"
	var out []string
	for _, f := range strings.Split(strings.ReplaceAll(v, ",,", comma), ",") {
		if f = strings.ReplaceAll(f, comma, ","); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// logDir reads --log-dir: an absolute path, not a file.
func (r rawFlags) logDir(c *Config) error {
	if c.LogDir = r["log-dir"]; c.LogDir == "" {
		return nil
	}
	var err error
	if c.LogDir, err = filepath.Abs(c.LogDir); err != nil {
		return usagef("--log-dir %q: %v", r["log-dir"], err)
	}
	if fi, err := os.Stat(c.LogDir); err == nil && !fi.IsDir() {
		return usagef("--log-dir %s exists and is not a directory", c.LogDir)
	}
	return nil
}

// plugins reads every --plugin, or $DDP_AGENT_PLUGINS without one.
func (r rawFlags) plugins(c *Config) error {
	var flags []string
	if r["plugin"] != "" {
		flags = strings.Split(r["plugin"], "\n")
	}
	specs, err := pluginhost.ParseSpecs(flags, r["plugins-env"])
	if err != nil {
		return usagef("%v", err)
	}
	c.Plugins = specs
	return nil
}

// stragglers reads --straggler-cost, --straggler-action and
// --straggler-confirm.
func (r rawFlags) stragglers(c *Config) error {
	var err error
	if c.StragglerCost, err = observe.ParseStragglerCost(r["straggler-cost"]); err != nil {
		return usagef("%v", err)
	}
	switch c.StragglerAction = r["straggler-action"]; c.StragglerAction {
	case "log", "restart", "drain":
	default:
		return usagef("--straggler-action %q is not one of log, restart, drain", c.StragglerAction)
	}
	d, err := r.seconds("straggler-confirm")
	if err != nil || d <= 0 {
		return usagef("--straggler-confirm must be a duration above 0 (seconds, or like 90s), got %q", r["straggler-confirm"])
	}
	c.StragglerConfirm = d
	return nil
}

func parseNNodes(v string) (min, max int, err error) {
	lo, hi, isRange := strings.Cut(v, ":")
	min, err1 := strconv.Atoi(lo)
	max, err2 := min, error(nil)
	if isRange {
		max, err2 = strconv.Atoi(hi)
	}
	if err1 != nil || err2 != nil || min < 1 || max < min {
		return 0, 0, usagef("--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got %q", v)
	}
	return min, max, nil
}

// Usage is the help text of `ddp-agent run`.
func Usage() string {
	var b strings.Builder
	b.WriteString(`Usage: ddp-agent run [flags] [--] script.py [script args...]

Starts --nproc-per-node workers of a PyTorch training script with torchrun's
environment, supervises them, and restarts the whole group when one fails.
Every flag also accepts torchrun's underscore spelling (--nproc_per_node), and
its default may come from PET_<FLAG> as with torchrun (PET_NPROC_PER_NODE=2).

Flags:
`)
	for _, f := range flagSpecs {
		name := "--" + f.name
		if f.short != "" {
			name = "-" + f.short + ", " + name
		}
		if !f.bool {
			name += " VALUE"
		}
		fmt.Fprintf(&b, "  %-28s %s", name, f.help)
		if f.def != "" && !f.bool {
			fmt.Fprintf(&b, " (default %s)", f.def)
		}
		b.WriteByte('\n')
	}
	b.WriteString(`
Exit codes: 0 all workers succeeded; 1 the job failed (restarts exhausted);
2 usage error; 3 this node drained (a GPU fault, --straggler-action drain, a
plugin's finding); 128+N the agent was stopped by signal N (130 SIGINT, 143
SIGTERM, 129 SIGHUP).
`)
	return b.String()
}
