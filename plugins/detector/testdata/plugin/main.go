// Command plugin is the detector plugin of the detector package's process
// tests: it says "echo" with its message option every 50 ms. Built with
// -ldflags "-X main.protocol=2" it speaks another protocol version, which
// the agent must refuse.
package main

import (
	"context"
	"strconv"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// protocol is set by -ldflags -X (which needs a plain string variable);
// empty, the plugin speaks this SDK's version through detector.Serve.
var protocol string

type echo struct{ message string }

func (*echo) Info(context.Context) (plugins.Info, error) {
	return plugins.Info{
		Name: "echo", Kind: plugins.KindDetector, Version: "0.0.1", Summary: "says its message",
		Options: []plugins.Option{{Name: "message", Default: "hello", Help: "what it says"}},
	}, nil
}

func (e *echo) Configure(_ context.Context, cfg plugins.Config) (detector.Schedule, error) {
	e.message = cfg.Get("message", "hello")
	return detector.Schedule{Every: time.Second}, nil
}

func (e *echo) Watch(ctx context.Context, emit func(detector.Finding) error) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		f := detector.Finding{Subject: "node", Severity: detector.SeverityOK, Action: detector.ActionNone, Message: e.message, Time: time.Now()}
		if err := emit(f); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func main() {
	e := &echo{}
	if protocol == "" || protocol == strconv.Itoa(plugins.ProtocolVersion) {
		detector.Serve(e)
		return
	}
	v, err := strconv.Atoi(protocol)
	if err != nil {
		panic(err)
	}
	hs := plugins.Handshake()
	hs.ProtocolVersion = uint(v)
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: hs,
		Plugins: goplugin.PluginSet{
			plugins.InfoName:             &plugins.InfoPlugin{Impl: e},
			string(plugins.KindDetector): &detector.Plugin{Impl: e},
		},
		GRPCServer: goplugin.DefaultGRPCServer,
	})
}
