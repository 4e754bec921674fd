package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// The sidecar's flags live in a flag.FlagSet, whose own conventions (help
// as "-name type" lines, "flag provided but not defined: -x" followed by
// the whole help, no underscores) differ from ddp-agent run's and status's,
// which follow torchrun: --name VALUE, torchrun's underscore spelling, one
// line for a mistake. These bring the FlagSet to that style.

// dashedArgs rewrites torchrun's underscore spelling of fs's flags
// (--metrics_addr) to the dashed one (--metrics-addr), leaving values and
// everything after the first argument that is not a flag as they are.
func dashedArgs(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			return append(out, args[i:]...)
		}
		if strings.HasPrefix(a, "---") { // as the flag package would: refused there
			out = append(out, a)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if f := fs.Lookup(strings.ReplaceAll(name, "_", "-")); f != nil {
			name = f.Name
			a = "--" + name
			if hasVal {
				a += "=" + val
			}
			if !hasVal && !isBoolFlag(f) && i+1 < len(args) {
				out = append(out, a, args[i+1]) // its value, whatever it looks like
				i++
				continue
			}
		}
		out = append(out, a)
	}
	return out
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// parseFlags parses args into fs in run's style; help is flag.ErrHelp, and
// every other error is one line to print after the command's name.
func parseFlags(fs *flag.FlagSet, args []string, command string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(dashedArgs(fs, args))
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		return fmt.Errorf("unknown flag --%s (see ddp-agent help %s)", strings.TrimLeft(name, "-"), command)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return fmt.Errorf("flag --%s needs a value", strings.TrimLeft(name, "-"))
	}
	// invalid value "x" for flag -name: ...
	return errors.New(strings.Replace(msg, "for flag -", "for flag --", 1))
}

// printFlags writes fs's flags as ddp-agent run's help does:
// "  --name VALUE   usage (default d)", in alphabetical order.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		left := "--" + f.Name
		if !isBoolFlag(f) {
			left += " VALUE"
		}
		line := fmt.Sprintf("  %-28s %s", left, f.Usage)
		if f.DefValue != "" && f.DefValue != "false" && !strings.Contains(f.Usage, "(default") {
			line += " (default " + f.DefValue + ")"
		}
		fmt.Fprintln(w, line)
	})
}
