package store

import (
	"context"
	"log/slog"
	"net/url"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// A member whose process is stopped (SIGSTOP, a frozen VM) or whose host
// dropped off the network keeps its TCP connection open: the kernel, or
// nothing at all, answers for it. Requests and streams that gRPC balanced
// onto it wait until gRPC's keepalive gives up, and grpc-go raises any
// keepalive below 10 s to 10 s, so a watch on it missed the lost node's
// deletion for ~12 s, and a lease kept alive through it expired. The
// client therefore asks each member's gRPC health service a few times a
// second, on a connection of its own, and cuts the connections to one
// that stays silent while another answers. (Not etcd's Status: a member
// just removed from the cluster panicked on it, recover.go.)
const (
	probeEvery = 500 * time.Millisecond
	// frozenAfter is the silence that counts as frozen: well inside the
	// 3 s lease TTL, so the watches and keep-alives are on live members
	// before the frozen agent's lease runs out; several probes long, so a
	// member busy for a moment is not cut.
	frozenAfter = 1500 * time.Millisecond
)

// frozenMembers returns the endpoints not heard from for longer than
// limit, as long as another was heard from within fresh of now: when none
// was, it is this agent (or the whole store) that is stalled, and cutting
// connections would help nothing.
func frozenMembers(heard map[string]time.Time, now time.Time, limit, fresh time.Duration) []string {
	alive := false
	for _, t := range heard {
		if now.Sub(t) <= fresh {
			alive = true
		}
	}
	if !alive {
		return nil
	}
	var out []string
	for ep, t := range heard {
		if now.Sub(t) > limit {
			out = append(out, ep)
		}
	}
	return out
}

// freezeWatch probes the client's members and cuts frozen ones.
type freezeWatch struct {
	cli    *clientv3.Client
	dialMu *sync.Mutex // the Client's eps: Dial reads the endpoints SetEndpoints writes
	conns  *conns
	log    *slog.Logger

	mu    sync.Mutex
	heard map[string]time.Time // by endpoint, from the probes
	cut   map[string]bool      // endpoints cut and silent since: said once
}

// run probes until ctx ends, following the client's endpoints as they
// change (members join and are removed).
func (f *freezeWatch) run(ctx context.Context) {
	probes := map[string]context.CancelFunc{}
	defer func() {
		for _, stop := range probes {
			stop()
		}
	}()
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for {
		want := map[string]bool{}
		for _, ep := range f.cli.Endpoints() {
			want[ep] = true
			if probes[ep] == nil {
				pctx, stop := context.WithCancel(ctx)
				probes[ep] = stop
				f.setHeard(ep, time.Now())
				go f.probe(pctx, ep)
			}
		}
		for ep, stop := range probes {
			if !want[ep] {
				stop()
				delete(probes, ep)
				f.mu.Lock()
				delete(f.heard, ep)
				delete(f.cut, ep)
				f.mu.Unlock()
			}
		}
		f.cutFrozen()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (f *freezeWatch) setHeard(ep string, t time.Time) {
	f.mu.Lock()
	f.heard[ep] = t
	was := f.cut[ep]
	delete(f.cut, ep)
	f.mu.Unlock()
	if was {
		f.log.Info("store member answers again", "endpoint", ep)
	}
}

// probe asks ep's health every probeEvery, on a connection of its own,
// and records each answer. Any answer counts, "not serving" or a refusal
// included: it shows the member's process is running.
func (f *freezeWatch) probe(ctx context.Context, ep string) {
	f.dialMu.Lock()
	conn, err := f.cli.Dial(ep)
	f.dialMu.Unlock()
	if err != nil {
		// Unprobed, it is never judged (nor cut): silence it did not
		// cause must not count against it.
		f.log.Debug("cannot probe store member", "endpoint", ep, "err", err)
		f.mu.Lock()
		delete(f.heard, ep)
		f.mu.Unlock()
		return
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, frozenAfter)
		_, err := hc.Check(rctx, &healthpb.HealthCheckRequest{})
		cancel()
		// A probe stopped meanwhile (its member left the endpoints) must
		// not put the member back.
		if c := status.Code(err); ctx.Err() == nil && c != codes.Unavailable && c != codes.DeadlineExceeded && c != codes.Canceled {
			f.setHeard(ep, time.Now())
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// cutFrozen cuts the connections to every member found frozen. A cut
// member counts as heard, so it is cut again (its reconnection hangs too)
// only after another silence; it is named once.
func (f *freezeWatch) cutFrozen() {
	now := time.Now()
	f.mu.Lock()
	eps := frozenMembers(f.heard, now, frozenAfter, 2*probeEvery)
	var news []bool
	for _, ep := range eps {
		f.heard[ep] = now
		news = append(news, !f.cut[ep])
		f.cut[ep] = true
	}
	f.mu.Unlock()
	for i, ep := range eps {
		addr := hostOf(ep)
		if addr == "" {
			continue
		}
		if n := f.conns.cut(addr); n > 0 && news[i] {
			f.log.Warn("store member answers nothing; cut its connections so requests go to the others",
				"endpoint", ep, "silent_for", frozenAfter, "connections", n)
		}
	}
}

// hostOf is the address etcd's client dials for an http(s) endpoint, its
// host:port; "" for other kinds (a unix socket is on this host, where a
// frozen member is this agent's own).
func hostOf(ep string) string {
	u, err := url.Parse(ep)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return ""
	}
	return u.Host
}
