package notifier_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
	notifierv1 "github.com/ddp-agent/ddp-agent/plugins/notifier/proto"
)

// fake is a notifier that keeps what it hears.
type fake struct {
	info      plugins.Info
	cfgErr    error
	notifyErr error
	gotCfg    chan plugins.Config
	got       chan notifier.Event
}

func newFake() *fake {
	return &fake{
		info: plugins.Info{
			Name: "fake", Kind: plugins.KindNotifier, Version: "0.1.0", Summary: "a test's notifier",
			Options: []plugins.Option{{Name: "url", Help: "where to post", Required: true}},
		},
		gotCfg: make(chan plugins.Config, 1),
		got:    make(chan notifier.Event, 8),
	}
}

func (f *fake) Info(context.Context) (plugins.Info, error) { return f.info, nil }

func (f *fake) Configure(_ context.Context, cfg plugins.Config) error {
	f.gotCfg <- cfg
	return f.cfgErr
}

func (f *fake) Notify(ctx context.Context, ev notifier.Event) error {
	select {
	case f.got <- ev:
		return f.notifyErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestRoundTripOfEveryField(t *testing.T) {
	f := newFake()
	n := notifier.TestClient(t, f)
	ctx := context.Background()
	info, err := n.Info(ctx)
	if err != nil || !reflect.DeepEqual(info, f.info) {
		t.Fatalf("Info = %+v, %v; want %+v", info, err, f.info)
	}
	cfg := plugins.Config{"url": "https://example.invalid/hook"}
	if err := n.Configure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if got := <-f.gotCfg; !reflect.DeepEqual(got, cfg) {
		t.Errorf("the plugin got %v, want %v", got, cfg)
	}
	for _, want := range []notifier.Event{
		{
			Kind: notifier.Straggler, Time: time.Date(2026, 11, 26, 1, 2, 3, 999, time.UTC),
			Job: "run-42", Node: "node-7", Generation: 1<<40 + 3, Attempt: 2, Rank: 13,
			Message: "rank 13 is 1.8x slower", Details: map[string]string{"cause": "thermal", "evidence": "sm clock 1.1 GHz"},
		},
		{Kind: notifier.JobStarted, Rank: -1}, // no time, no details, no rank
		{Kind: "a_kind_of_tomorrow", Rank: 0, Message: "multi\nline\nreport"},
	} {
		if err := n.Notify(ctx, want); err != nil {
			t.Fatal(err)
		}
		got := <-f.got
		if !got.Time.Equal(want.Time) || got.Time.IsZero() != want.Time.IsZero() {
			t.Errorf("time %v, want %v", got.Time, want.Time)
		}
		got.Time, want.Time = time.Time{}, time.Time{}
		if len(want.Details) == 0 && len(got.Details) == 0 {
			got.Details, want.Details = nil, nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("event %+v, want %+v", got, want)
		}
	}
}

func TestErrorsAreThePluginsWords(t *testing.T) {
	f := newFake()
	f.cfgErr = errors.New(`plugin fake: option "url" is required`)
	f.notifyErr = errors.New("POST https://example.invalid/hook: 503")
	n := notifier.TestClient(t, f)
	ctx := context.Background()
	if err := n.Configure(ctx, nil); err == nil || err.Error() != f.cfgErr.Error() {
		t.Errorf("Configure = %v, want %q", err, f.cfgErr)
	}
	if err := n.Notify(ctx, notifier.Event{Kind: notifier.Hang, Rank: -1}); err == nil || err.Error() != f.notifyErr.Error() {
		t.Errorf("Notify = %v, want %q", err, f.notifyErr)
	}
}

func TestNotifyDeadline(t *testing.T) {
	f := newFake()
	f.got = make(chan notifier.Event) // nobody reads: Notify blocks
	n := notifier.TestClient(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := n.Notify(ctx, notifier.Event{Kind: notifier.Hang, Rank: -1})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Notify = %v, want the deadline's error", err)
	}
}

func TestRankOutOfRangeRefused(t *testing.T) {
	f := newFake()
	n := notifier.TestClient(t, f)
	for _, rank := range []int{-2, 1 << 31} {
		err := n.Notify(context.Background(), notifier.Event{Kind: notifier.Straggler, Rank: rank})
		if err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("rank %d: Notify = %v, want a refusal", rank, err)
		}
	}
	select {
	case ev := <-f.got:
		t.Errorf("the plugin heard %+v", ev)
	default:
	}
}

// TestServerRefusesBadEvents: what a client in another language could
// send that no Go client does.
func TestServerRefusesBadEvents(t *testing.T) {
	f := newFake()
	conn, srv := goplugin.TestGRPCConn(t, func(s *grpc.Server) {
		if err := (notifier.Plugin{Impl: f}).GRPCServer(nil, s); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { _ = conn.Close(); srv.Stop() })
	rpc := notifierv1.NewNotifierClient(conn)
	for _, tc := range []struct {
		ev   *notifierv1.Event
		want string
	}{
		{&notifierv1.Event{Rank: -1}, "event refused: no kind"},
		{&notifierv1.Event{Kind: "hang", Rank: -7}, "event refused: rank -7 out of range"},
	} {
		_, err := rpc.Notify(context.Background(), tc.ev)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Notify(%v) = %v, want %q", tc.ev, err, tc.want)
		}
	}
	select {
	case ev := <-f.got:
		t.Errorf("the plugin heard %+v", ev)
	default:
	}
}
