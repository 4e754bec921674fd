package plugins

import (
	"context"
	"fmt"

	pluginsv1 "github.com/ddp-agent/ddp-agent/plugins/proto"
)

// infoServer answers the Plugin service from a plugin's Described.
type infoServer struct {
	pluginsv1.UnimplementedPluginServer
	impl Described
}

func (s infoServer) Info(ctx context.Context, _ *pluginsv1.InfoRequest) (*pluginsv1.InfoResponse, error) {
	info, err := s.impl.Info(ctx)
	if err != nil {
		return nil, err
	}
	return infoToWire(info)
}

// infoClient is the agent's side of the Plugin service.
type infoClient struct {
	rpc pluginsv1.PluginClient
}

func (c infoClient) Info(ctx context.Context) (Info, error) {
	resp, err := c.rpc.Info(ctx, &pluginsv1.InfoRequest{})
	if err != nil {
		return Info{}, RPCError(ctx, "info", err)
	}
	return infoFromWire(resp), nil
}

// infoToWire refuses a kind the protocol cannot say: a plugin author's
// typo is caught in the plugin, with the plugin's name.
func infoToWire(info Info) (*pluginsv1.InfoResponse, error) {
	var kind pluginsv1.Kind
	switch info.Kind {
	case KindDetector:
		kind = pluginsv1.Kind_KIND_DETECTOR
	case KindNotifier:
		kind = pluginsv1.Kind_KIND_NOTIFIER
	default:
		return nil, fmt.Errorf("plugin %s: kind %q is neither %q nor %q", info.Name, info.Kind, KindDetector, KindNotifier)
	}
	resp := &pluginsv1.InfoResponse{
		Name:    info.Name,
		Kind:    kind,
		Version: info.Version,
		Summary: info.Summary,
		Options: make([]*pluginsv1.Option, len(info.Options)),
	}
	for i, o := range info.Options {
		resp.Options[i] = &pluginsv1.Option{Name: o.Name, Default: o.Default, Help: o.Help, Required: o.Required}
	}
	return resp, nil
}

// infoFromWire keeps a kind it does not know as a Kind that names it, so
// the agent refuses the plugin with that name rather than failing to read
// its description.
func infoFromWire(resp *pluginsv1.InfoResponse) Info {
	info := Info{
		Name:    resp.GetName(),
		Version: resp.GetVersion(),
		Summary: resp.GetSummary(),
	}
	switch k := resp.GetKind(); k {
	case pluginsv1.Kind_KIND_DETECTOR:
		info.Kind = KindDetector
	case pluginsv1.Kind_KIND_NOTIFIER:
		info.Kind = KindNotifier
	case pluginsv1.Kind_KIND_UNSPECIFIED:
		info.Kind = ""
	default:
		info.Kind = Kind(fmt.Sprintf("kind(%d)", int32(k)))
	}
	if n := len(resp.GetOptions()); n > 0 {
		info.Options = make([]Option, n)
	}
	for i, o := range resp.GetOptions() {
		info.Options[i] = Option{Name: o.GetName(), Default: o.GetDefault(), Help: o.GetHelp(), Required: o.GetRequired()}
	}
	return info
}
