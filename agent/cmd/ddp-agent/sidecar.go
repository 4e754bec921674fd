package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/sidecar"
	"github.com/ddp-agent/ddp-agent/internal/envname"
	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/health"
)

const sidecarUsage = `Usage: ddp-agent sidecar [flags]

Runs beside a launcher ddp-agent does not replace (torchrun, srun, a
Kubeflow job), one per node and user, launching nothing. Workers whose
script calls ddp_agent.register(model) find it on their own and send it
their collectives: it names stalls and persistent stragglers, reports a
hang with the missing ranks' Python stacks, watches the GPUs, exports
traces, metrics and Perfetto files, and on a hang (or a GPU or plugin
finding that calls for a restart) aborts the workers' communicators so
that they fail at once and their launcher restarts them.

The socket is $DDP_AGENT_SOCKET, else $XDG_RUNTIME_DIR/ddp-agent/sidecar.sock,
else $TMPDIR (or /tmp)/ddp-agent-sidecar-<uid>/sidecar.sock, in a directory
that must be the user's alone; only processes of the same user are admitted. See docs/sidecar.md.

Flags (torchrun's underscore spelling works too: --metrics_addr):
`

// sidecarFlags parses the sidecar's command line into its config. On -h
// or --help it writes the help to help and returns flag.ErrHelp.
func sidecarFlags(args []string, getenv func(string) string, help io.Writer) (sidecar.Config, slog.Level, error) {
	fs := flag.NewFlagSet("ddp-agent sidecar", flag.ContinueOnError)
	var cfg sidecar.Config
	var level string
	var plugins []string
	fs.StringVar(&cfg.Socket, "socket", "", "the control socket's path (default: $DDP_AGENT_SOCKET, else the per-user path above)")
	fs.StringVar(&cfg.LogDir, "log-dir", "", "write each job's Perfetto trace files into DIR/<job id> (without an OTLP collector for traces)")
	checkTelemetry := observe.Flags(fs, &cfg.Telemetry)
	cfg.Linger = sidecar.DefaultLinger
	fs.Func("job-linger", fmt.Sprintf("how long a job whose workers all disconnected is kept (its launcher's restart brings them back); then its traces are flushed; seconds, or like 90s (default %gs)", sidecar.DefaultLinger.Seconds()), func(s string) (err error) {
		cfg.Linger, err = parseSeconds(s)
		return err
	})
	fs.Func("plugin", "a plugin, as for ddp-agent run: NAME[,key=value...] or /path/to/plugin[,key=value...] (repeatable; also $DDP_AGENT_PLUGINS)", func(s string) error {
		plugins = append(plugins, s)
		return nil
	})
	fs.StringVar(&level, "log-level", "info", "the sidecar's log: debug, info, warn or error")
	if err := parseFlags(fs, args, "sidecar"); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(help, sidecarUsage)
			printFlags(help, fs)
		}
		return cfg, 0, err
	}
	if fs.NArg() > 0 {
		return cfg, 0, fmt.Errorf("unexpected argument %q: the sidecar launches nothing (ddp-agent run does)", fs.Arg(0))
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return cfg, 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	if err := checkTelemetry(); err != nil {
		return cfg, 0, err
	}
	if cfg.Linger < time.Second {
		return cfg, 0, fmt.Errorf("--job-linger %v: at least 1s (a launcher's restart takes that)", cfg.Linger)
	}
	specs, err := pluginhost.ParseSpecs(plugins, getenv(envname.Plugins))
	if err != nil {
		return cfg, 0, err
	}
	cfg.Plugins, cfg.PluginDir = specs, getenv(envname.PluginDir)
	cfg.Telemetry.OTLPProtocol = otlpProtocol(cfg.Telemetry.OTelEndpoint, getenv)
	return cfg, lvl, nil
}

func runSidecar(args []string, stdout, stderr io.Writer) int {
	cfg, level, err := sidecarFlags(args, os.Getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "ddp-agent sidecar: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("component", "ddp-agent-sidecar")
	node := discoverGPUs(context.Background(), os.Getenv)
	defer node.close()
	if node.err != nil {
		fmt.Fprintf(stderr, "ddp-agent sidecar: %v\n", node.err)
		return 2
	}
	if node.topo != nil {
		g := &sidecar.GPUs{Topology: node.topo}
		if lib := node.lib; lib != nil {
			g.Watch = func(devs []health.Device, opts ...health.Option) *health.Watcher {
				return health.NewWatcher(lib, devs, opts...)
			}
			g.State = func(uuid string) (nvml.GPUState, error) { return nvml.ReadGPUState(lib, uuid) }
		}
		cfg.GPUs = g
	} else {
		log.Info("no NVIDIA GPU (" + node.none + "): no GPU health watch")
	}
	if f, ok := stderr.(*os.File); ok { // a hang's stacks, readable on a terminal
		cfg.Telemetry.Console = observe.Terminal(f)
	}
	cfg.Telemetry.Version = version
	sc, err := sidecar.New(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "ddp-agent sidecar: %v\n", err)
		return 1
	}
	defer startGuard(log)() // for the plugins' descendants
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	var refused *pluginhost.RefusedError
	if err := sc.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "ddp-agent sidecar: %v\n", err)
		if errors.As(err, &refused) {
			return 2
		}
		return 1
	}
	log.Info("sidecar stopped")
	return 0
}
