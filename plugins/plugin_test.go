package plugins

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginsv1 "github.com/ddp-agent/ddp-agent/plugins/proto"
)

func TestHandshake(t *testing.T) {
	h := Handshake()
	if h.ProtocolVersion != ProtocolVersion || h.MagicCookieKey != MagicCookieKey || h.MagicCookieValue != MagicCookieValue {
		t.Fatalf("Handshake() = %+v", h)
	}
}

func TestInfoWireRoundTrip(t *testing.T) {
	for _, info := range []Info{
		{Name: "exec", Kind: KindDetector, Version: "1", Summary: "s", Options: []Option{{Name: "command", Help: "h", Required: true}, {Name: "interval", Default: "30s"}}},
		{Name: "webhook", Kind: KindNotifier},
	} {
		msg, err := infoToWire(info)
		if err != nil {
			t.Fatal(err)
		}
		got := infoFromWire(msg)
		if got.Name != info.Name || got.Kind != info.Kind || got.Version != info.Version || got.Summary != info.Summary || len(got.Options) != len(info.Options) {
			t.Fatalf("%+v came back as %+v", info, got)
		}
		for i := range info.Options {
			if got.Options[i] != info.Options[i] {
				t.Errorf("option %d: %+v, want %+v", i, got.Options[i], info.Options[i])
			}
		}
	}
	if _, err := infoToWire(Info{Name: "x", Kind: "probe"}); err == nil {
		t.Error("a kind the protocol cannot say went on the wire")
	}
}

// An unknown kind from the wire is kept as a name, for the agent to
// refuse with it.
func TestInfoFromWireUnknownKind(t *testing.T) {
	if k := infoFromWire(&pluginsv1.InfoResponse{Kind: 7}).Kind; k != "kind(7)" {
		t.Errorf("kind 7 read as %q", k)
	}
	if k := infoFromWire(&pluginsv1.InfoResponse{}).Kind; k != "" {
		t.Errorf("an unset kind read as %q", k)
	}
}

func TestRPCError(t *testing.T) {
	ctx := context.Background()
	if err := RPCError(ctx, "info", status.Error(codes.Unknown, "option x is bad")); err.Error() != "option x is bad" {
		t.Errorf("the plugin's own error came back as %q", err)
	}
	err := RPCError(ctx, "info", status.Error(codes.Unavailable, "connection refused"))
	if !strings.HasPrefix(err.Error(), "info: ") || status.Code(errors.Unwrap(err)) != codes.Unavailable {
		t.Errorf("a transport error came back as %q", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := RPCError(cancelled, "watch", status.Error(codes.Canceled, "context canceled")); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled call came back as %v", err)
	}
}

func TestWatchParent(t *testing.T) {
	var ppid atomic.Int64
	ppid.Store(4242)
	gone := make(chan struct{})
	go watchParent(context.Background(), time.Millisecond, func() int { return int(ppid.Load()) }, func() { close(gone) })
	select {
	case <-gone:
		t.Fatal("gone before the parent changed")
	case <-time.After(20 * time.Millisecond):
	}
	ppid.Store(1) // adopted by init
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("a new parent went unnoticed")
	}
}

func TestWatchParentEndsWithCtx(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		watchParent(ctx, time.Millisecond, func() int { return 1 }, func() { t.Error("gone called") })
		close(done)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("WatchParent did not return with its ctx")
	}
}
