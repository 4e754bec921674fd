package plugins

import (
	"context"
	"errors"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pluginsv1 "github.com/ddp-agent/ddp-agent/plugins/proto"
)

// InfoName is the key of the info service in a go-plugin PluginSet: every
// plugin serves it beside its kind's own ("detector" or "notifier"), so
// the agent can ask what a binary is before dispensing its kind.
const InfoName = "info"

// Handshake is what the agent and a plugin must agree on before anything
// else: the protocol version and the cookie. It is a function, not a
// variable, so that nobody can change it for everyone.
func Handshake() goplugin.HandshakeConfig {
	return goplugin.HandshakeConfig{
		ProtocolVersion:  ProtocolVersion,
		MagicCookieKey:   MagicCookieKey,
		MagicCookieValue: MagicCookieValue,
	}
}

// Described is what every plugin answers first: its self-description.
// detector.Detector and notifier.Notifier both include it.
type Described interface {
	Info(ctx context.Context) (Info, error)
}

// InfoPlugin is the go-plugin glue of the info service (gRPC only). A
// plugin serves it with Impl set; the agent puts the zero value in its
// client set and gets a Described from Dispense(InfoName).
type InfoPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	Impl Described
}

// GRPCServer registers the Plugin service on the plugin's server.
func (p InfoPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("info plugin: no implementation to serve")
	}
	pluginsv1.RegisterPluginServer(s, infoServer{impl: p.Impl})
	return nil
}

// GRPCClient returns the agent's side: a Described over conn.
func (InfoPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return InfoClient(conn), nil
}

// InfoClient is a Described that asks the plugin at the other end of
// conn. The kinds' clients embed it, so that their Info goes through the
// one info service on the same connection.
func InfoClient(conn grpc.ClientConnInterface) Described {
	return infoClient{rpc: pluginsv1.NewPluginClient(conn)}
}

// Compile-time checks: both the values and the pointers are go-plugin
// plugins, whichever a set holds.
var (
	_ goplugin.GRPCPlugin = InfoPlugin{}
	_ goplugin.GRPCPlugin = &InfoPlugin{}
)
