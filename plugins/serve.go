package plugins

import (
	"context"
	"fmt"
	"os"

	goplugin "github.com/hashicorp/go-plugin"
)

// Serve serves set as this process's plugin over gRPC and returns when
// the agent closes it; detector.Serve and notifier.Serve call it with
// their kind's set. It exits the process when the agent dies
// (WatchParent), and when the process was not started by an agent (no
// handshake cookie) it says so in one line and exits 1.
func Serve(set goplugin.PluginSet) {
	if !StartedByAgent() {
		fmt.Fprintf(os.Stderr, "%s is a ddp-agent plugin (protocol %d): the agent starts it, with `ddp-agent run --plugin %s[,key=value...]`; it does nothing run by hand\n",
			os.Args[0], ProtocolVersion, os.Args[0])
		os.Exit(1)
	}
	go WatchParent(context.Background(), func() { os.Exit(1) })
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: Handshake(),
		Plugins:         set,
		GRPCServer:      goplugin.DefaultGRPCServer,
	})
}

// StartedByAgent reports whether this process has the handshake cookie
// that the agent (go-plugin) sets in a plugin's environment.
func StartedByAgent() bool {
	return os.Getenv(MagicCookieKey) == MagicCookieValue
}
