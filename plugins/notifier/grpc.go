package notifier

import (
	"context"
	"fmt"

	"github.com/ddp-agent/ddp-agent/plugins"
	notifierv1 "github.com/ddp-agent/ddp-agent/plugins/notifier/proto"
)

// server answers the Notifier service from a plugin's Notifier.
type server struct {
	notifierv1.UnimplementedNotifierServer
	impl Notifier
}

func (s *server) Configure(ctx context.Context, req *notifierv1.ConfigureRequest) (*notifierv1.ConfigureResponse, error) {
	if err := s.impl.Configure(ctx, plugins.Config(req.GetConfig())); err != nil {
		return nil, err
	}
	return &notifierv1.ConfigureResponse{}, nil
}

func (s *server) Notify(ctx context.Context, msg *notifierv1.Event) (*notifierv1.NotifyResponse, error) {
	ev, err := eventFromWire(msg)
	if err != nil {
		return nil, fmt.Errorf("event refused: %w", err)
	}
	if err := s.impl.Notify(ctx, ev); err != nil {
		return nil, err
	}
	return &notifierv1.NotifyResponse{}, nil
}

// client is the agent's side of a notifier plugin.
type client struct {
	plugins.Described
	rpc notifierv1.NotifierClient
}

func (c client) Configure(ctx context.Context, cfg plugins.Config) error {
	_, err := c.rpc.Configure(ctx, &notifierv1.ConfigureRequest{Config: cfg})
	return plugins.RPCError(ctx, "configure", err)
}

// Notify refuses an event the protocol cannot carry before sending it.
func (c client) Notify(ctx context.Context, ev Event) error {
	msg, err := eventToWire(ev)
	if err != nil {
		return fmt.Errorf("notifier: event %s refused: %w", ev.Kind, err)
	}
	_, err = c.rpc.Notify(ctx, msg)
	return plugins.RPCError(ctx, "notify", err)
}
