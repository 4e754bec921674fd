package detector

import (
	"context"
	"errors"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/ddp-agent/ddp-agent/plugins"
	detectorv1 "github.com/ddp-agent/ddp-agent/plugins/detector/proto"
)

// Plugin is the go-plugin glue of the detector kind (gRPC only). A plugin
// serves it with Impl set (Serve does); the agent puts the zero value in
// its client set and gets a Detector from Dispense("detector").
type Plugin struct {
	goplugin.NetRPCUnsupportedPlugin
	Impl Detector
}

// GRPCServer registers the Detector service on the plugin's server.
func (p Plugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("detector plugin: no implementation to serve")
	}
	detectorv1.RegisterDetectorServer(s, &server{impl: p.Impl})
	return nil
}

// GRPCClient returns the agent's side: a Detector over conn, whose Info
// asks the info service on the same connection.
func (Plugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return client{Described: plugins.InfoClient(conn), rpc: detectorv1.NewDetectorClient(conn)}, nil
}

// Serve serves d as this process's plugin: the info service and the
// detector service, over gRPC with go-plugin's handshake (plugins.Serve).
// A plugin's main calls it and nothing else; it returns when the agent
// closes the plugin, and exits the process when the agent dies.
func Serve(d Detector) {
	plugins.Serve(pluginSet(d))
}

// pluginSet is what a detector plugin serves.
func pluginSet(d Detector) goplugin.PluginSet {
	return goplugin.PluginSet{
		plugins.InfoName:             &plugins.InfoPlugin{Impl: d},
		string(plugins.KindDetector): &Plugin{Impl: d},
	}
}

var (
	_ goplugin.GRPCPlugin = Plugin{}
	_ goplugin.GRPCPlugin = &Plugin{}
)
