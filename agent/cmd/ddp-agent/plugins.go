package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/internal/envname"
	"github.com/ddp-agent/ddp-agent/plugins"
)

const pluginsUsage = `Usage: ddp-agent plugins [--json] [/path/to/plugin...]

Lists the bundled plugins (served by ddp-agent-plugins next to ddp-agent,
or in $DDP_AGENT_PLUGIN_DIR) with their kind, version and options, or the
external plugins named by path. Each is started and asked, over the same
handshake ddp-agent run uses: a plugin listed here starts.
Use one with: ddp-agent run --plugin NAME[,key=value...] ...
`

func runPlugins(args []string, stdout, stderr io.Writer) int {
	asJSON := false
	var specs []pluginhost.Spec
	for _, a := range args {
		switch {
		case a == "--json":
			asJSON = true
		case a == "-h" || a == "--help":
			fmt.Fprint(stdout, pluginsUsage)
			return 0
		case strings.HasPrefix(a, "-"):
			fmt.Fprintf(stderr, "ddp-agent plugins: unknown flag %s\n%s", a, pluginsUsage)
			return 2
		default:
			sp, err := pluginhost.ParseSpec(a)
			if err != nil || sp.Path == "" {
				fmt.Fprintf(stderr, "ddp-agent plugins: %q is not a path to a plugin (bundled ones are listed without arguments)\n", a)
				return 2
			}
			specs = append(specs, sp)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := pluginhost.BundledDir(os.Getenv(envname.PluginDir))
	if len(specs) == 0 {
		names, err := pluginhost.Bundled(ctx, dir)
		if err != nil {
			fmt.Fprintf(stderr, "ddp-agent plugins: %v\n", err)
			return 1
		}
		for _, n := range names {
			specs = append(specs, pluginhost.Spec{Name: n, Raw: n})
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	infos, err := pluginhost.Describe(ctx, dir, specs, log)
	if err != nil {
		fmt.Fprintf(stderr, "ddp-agent plugins: %v\n", err)
		return 1
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(infos); err != nil {
			return 1
		}
		return 0
	}
	printInfos(stdout, infos)
	return 0
}

func printInfos(w io.Writer, infos []plugins.Info) {
	for i, in := range infos {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s (%s %s): %s\n", in.Name, in.Kind, in.Version, in.Summary)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, o := range in.Options {
			def := o.Default
			if o.Required {
				def = "(required)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", o.Name, def, o.Help)
		}
		tw.Flush()
	}
}
