package plugins

import (
	"context"
	"fmt"
	"os"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// Serve serves set as this process's plugin over gRPC and returns when
// the agent closes it; detector.Serve and notifier.Serve call it with
// their kind's set. It exits the process when the agent dies
// (WatchParent), and when the process was not started by an agent (no
// handshake cookie) it says so in one line and exits 1. What the plugin
// writes to os.Stderr goes to the process's stderr, which the agent reads
// to its end (stderrKeeper), not to go-plugin's stream.
func Serve(set goplugin.PluginSet) {
	if !StartedByAgent() {
		fmt.Fprintf(os.Stderr, "%s is a ddp-agent plugin (protocol %d): the agent starts it, with `ddp-agent run --plugin %s[,key=value...]`; it does nothing run by hand\n",
			os.Args[0], ProtocolVersion, os.Args[0])
		os.Exit(1)
	}
	go WatchParent(context.Background(), func() { os.Exit(1) })
	keep := newStderrKeeper()
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: Handshake(),
		Plugins:         set,
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return goplugin.DefaultGRPCServer(append(opts, keep.serverOptions()...))
		},
	})
}

// StartedByAgent reports whether this process has the handshake cookie
// that the agent (go-plugin) sets in a plugin's environment.
func StartedByAgent() bool {
	return os.Getenv(MagicCookieKey) == MagicCookieValue
}
