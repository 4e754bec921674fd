// Command ddp-agent-plugins serves ddp-agent's bundled plugins, one per
// process: the agent runs `ddp-agent-plugins NAME` for --plugin NAME and
// talks to it over go-plugin. It lives next to ddp-agent.
//
//	ddp-agent-plugins NAME      serve the bundled plugin NAME (the agent does this)
//	ddp-agent-plugins --list    the bundled plugins' names, one per line
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ddp-agent/ddp-agent/plugins"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, plugins.StartedByAgent()))
}

// run serves the plugin args name and returns when the agent closes it;
// byAgent says whether the agent started this process (the handshake
// cookie is set). It returns the exit code.
func run(args []string, stdout, stderr io.Writer, byAgent bool) int {
	reg := bundled()
	if len(args) == 1 && (args[0] == "--list" || args[0] == "-list") {
		for _, name := range reg.names() {
			fmt.Fprintln(stdout, name)
		}
		return 0
	}
	if len(args) != 1 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "usage: ddp-agent-plugins NAME | --list (bundled: %s)\n", strings.Join(reg.names(), ", "))
		return 2
	}
	name := args[0]
	serve, ok := reg[name]
	if !ok {
		fmt.Fprintf(stderr, "ddp-agent-plugins: no bundled plugin %q (bundled: %s)\n", name, strings.Join(reg.names(), ", "))
		return 2
	}
	if !byAgent {
		// go-plugin would say this too, in three lines that do not name
		// the agent's flag.
		fmt.Fprintf(stderr, "ddp-agent-plugins: %s is a ddp-agent plugin, started by `ddp-agent run --plugin %s[,key=value...]`; it does nothing run by hand\n", name, name)
		return 1
	}
	serve()
	return 0
}
