package rdzv

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// TestStoreMembers: a three-member store lists three members, one of them
// the leader, each healthy at its own endpoint; a stopped member is listed
// unreachable, with why, and the other two still answer.
func TestStoreMembers(t *testing.T) {
	cl, err := store.StartCluster(t.Context(), 3, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	cli, err := store.Dial(t.Context(), store.ClientConfig{Endpoints: cl.Endpoints(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	read := func() []StoreMember {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		ms, err := readStoreMembers(ctx, cli.Etcd(), cli.Etcd().Endpoints())
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	ms := read()
	leaders, healthy := 0, 0
	var eps []string
	for _, m := range ms {
		if m.Leader {
			leaders++
		}
		if m.Healthy {
			healthy++
		}
		eps = append(eps, m.Endpoints...)
	}
	slices.Sort(eps)
	want := cl.Endpoints()
	slices.Sort(want)
	if len(ms) != 3 || leaders != 1 || healthy != 3 || !slices.Equal(eps, want) {
		t.Fatalf("members %+v; want 3 healthy at %v, one leader", ms, want)
	}

	stopped := cl.Endpoints()[2]
	if err := cl.Stop(2); err != nil {
		t.Fatal(err)
	}
	healthy = 0
	for _, m := range read() {
		switch {
		case slices.Contains(m.Endpoints, stopped):
			if m.Healthy || m.Error == "" {
				t.Errorf("the stopped member %+v, want unreachable with why", m)
			}
		case m.Healthy:
			healthy++
		}
	}
	if healthy != 2 {
		t.Errorf("%d healthy members after stopping one, want 2", healthy)
	}
}

func TestMemberTargets(t *testing.T) {
	for _, tc := range []struct {
		urls []string
		want string
	}{
		{[]string{"http://10.0.0.1:2379", "https://h:2380"}, "10.0.0.1:2379,h:2380"},
		{[]string{"http://127.0.0.1:0"}, ""}, // etcd on port 0 advertises 0: not where it is
		{[]string{"::not a url"}, ""},
	} {
		if got := strings.Join(memberTargets(tc.urls), ","); got != tc.want {
			t.Errorf("memberTargets(%q) = %q, want %q", tc.urls, got, tc.want)
		}
	}
	if got := strings.Join(hostsOf([]string{"http://127.0.0.1:1", "127.0.0.1:2"}), ","); got != "127.0.0.1:1,127.0.0.1:2" {
		t.Errorf("hostsOf: %q", got)
	}
}
