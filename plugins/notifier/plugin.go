package notifier

import (
	"context"
	"errors"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/ddp-agent/ddp-agent/plugins"
	notifierv1 "github.com/ddp-agent/ddp-agent/plugins/notifier/proto"
)

// Plugin is the go-plugin glue of the notifier kind (gRPC only). A plugin
// serves it with Impl set (Serve does); the agent puts the zero value in
// its client set and gets a Notifier from Dispense("notifier").
type Plugin struct {
	goplugin.NetRPCUnsupportedPlugin
	Impl Notifier
}

// GRPCServer registers the Notifier service on the plugin's server.
func (p Plugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("notifier plugin: no implementation to serve")
	}
	notifierv1.RegisterNotifierServer(s, &server{impl: p.Impl})
	return nil
}

// GRPCClient returns the agent's side: a Notifier over conn, whose Info
// asks the info service on the same connection.
func (Plugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return client{Described: plugins.InfoClient(conn), rpc: notifierv1.NewNotifierClient(conn)}, nil
}

// Serve serves n as this process's plugin: the info service and the
// notifier service, over gRPC with go-plugin's handshake (plugins.Serve).
// A plugin's main calls it and nothing else; it returns when the agent
// closes the plugin, and exits the process when the agent dies.
func Serve(n Notifier) {
	plugins.Serve(pluginSet(n))
}

// pluginSet is what a notifier plugin serves.
func pluginSet(n Notifier) goplugin.PluginSet {
	return goplugin.PluginSet{
		plugins.InfoName:             &plugins.InfoPlugin{Impl: n},
		string(plugins.KindNotifier): &Plugin{Impl: n},
	}
}

var (
	_ goplugin.GRPCPlugin = Plugin{}
	_ goplugin.GRPCPlugin = &Plugin{}
)
