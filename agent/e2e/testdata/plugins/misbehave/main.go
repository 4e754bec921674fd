// Command misbehave is a detector plugin that misbehaves as its binary's
// name says, for the agent's plugin fault tests: crash (exits after its
// first verdict), hang (promises a verdict every 200 ms, sends one, then
// nothing), garbage (writes garbage to stdout before the handshake), v2
// (speaks plugin protocol 2); and steady, which behaves: a healthy
// verdict every 100 ms.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

type bad struct{ mode string }

func (b bad) Info(context.Context) (plugins.Info, error) {
	return plugins.Info{Name: b.mode, Kind: plugins.KindDetector, Version: "0.0.1", Summary: "misbehaves: " + b.mode}, nil
}

func (b bad) Configure(context.Context, plugins.Config) (detector.Schedule, error) {
	return detector.Schedule{Every: 200 * time.Millisecond}, nil
}

func (b bad) Watch(ctx context.Context, emit func(detector.Finding) error) error {
	if err := emit(detector.Finding{Subject: "node", Message: "healthy"}); err != nil {
		return err
	}
	for b.mode == "steady" {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
		if err := emit(detector.Finding{Subject: "node", Message: "healthy"}); err != nil {
			return err
		}
	}
	if b.mode == "crash" {
		time.Sleep(300 * time.Millisecond)
		fmt.Fprintln(os.Stderr, "misbehave: crashing on purpose")
		os.Exit(1)
	}
	<-ctx.Done() // hang, and v2 if it ever got this far
	return nil
}

func main() {
	b := bad{mode: filepath.Base(os.Args[0])}
	switch b.mode {
	case "garbage":
		fmt.Println("this is not a go-plugin handshake")
	case "v2":
		hs := plugins.Handshake()
		hs.ProtocolVersion = 2
		goplugin.Serve(&goplugin.ServeConfig{HandshakeConfig: hs, GRPCServer: goplugin.DefaultGRPCServer,
			Plugins: goplugin.PluginSet{plugins.InfoName: &plugins.InfoPlugin{Impl: b}, "detector": &detector.Plugin{Impl: b}}})
		return
	}
	detector.Serve(b)
}
