// Command misbehave is a detector plugin that misbehaves as its binary's
// name says, for the agent's plugin fault tests: crash (exits after its
// first verdict), hang (promises a verdict every 200 ms, sends one, then
// nothing), garbage (writes garbage to stdout before the handshake), v2
// (speaks plugin protocol 2), silent (never completes its handshake),
// flood (sends warnings of 3 MiB, each on a subject of its own, and
// writes its stderr, as fast as it can); and steady, which behaves: a
// healthy verdict every 100 ms.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// bad's name is its binary's, and so is its mode, but that silent2 is
// silent too (two plugins that misbehave alike).
type bad struct{ name, mode string }

func (b bad) Info(context.Context) (plugins.Info, error) {
	return plugins.Info{Name: b.name, Kind: plugins.KindDetector, Version: "0.0.1", Summary: "misbehaves: " + b.mode}, nil
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
	if b.mode == "flood" {
		return flood(ctx, emit)
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
	name := filepath.Base(os.Args[0])
	b := bad{name: name, mode: name}
	if strings.HasPrefix(name, "silent") {
		b.mode = "silent"
	}
	switch b.mode {
	case "garbage":
		fmt.Println("this is not a go-plugin handshake")
	case "silent":
		time.Sleep(time.Hour)
	case "v2":
		hs := plugins.Handshake()
		hs.ProtocolVersion = 2
		goplugin.Serve(&goplugin.ServeConfig{HandshakeConfig: hs, GRPCServer: goplugin.DefaultGRPCServer,
			Plugins: goplugin.PluginSet{plugins.InfoName: &plugins.InfoPlugin{Impl: b}, "detector": &detector.Plugin{Impl: b}}})
		return
	}
	detector.Serve(b)
}

// flood floods: a 3 MiB warning on a new subject every 50 ms, healthy
// verdicts as fast as the agent takes them in between, and stderr lines
// as fast as it can write them.
func flood(ctx context.Context, emit func(detector.Finding) error) error {
	go func() {
		for ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "flood: a line of stderr", time.Now().UnixNano())
		}
	}()
	big := strings.Repeat("x", 3<<20)
	next := time.Now()
	for i := 0; ctx.Err() == nil; i++ {
		f := detector.Finding{Subject: "node", Message: "healthy"}
		if time.Now().After(next) {
			f = detector.Finding{Subject: fmt.Sprintf("subject-%d", i), Severity: detector.SeverityWarning, Action: detector.ActionWarn, Message: big}
			next = time.Now().Add(50 * time.Millisecond)
		}
		if err := emit(f); err != nil {
			return err
		}
	}
	return nil
}
