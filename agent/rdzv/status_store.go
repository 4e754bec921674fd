package rdzv

import (
	"context"
	"fmt"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// StoreMember is one member of the store's etcd cluster as `ddp-agent
// status` shows it: who it is, whether it answers, and who leads. Its JSON
// form is under "store_members" in `status --json`.
type StoreMember struct {
	Name      string   `json:"name"`
	ID        string   `json:"id"`        // etcd's member id, hex
	Endpoints []string `json:"endpoints"` // where clients reach it (host:port)
	Learner   bool     `json:"learner,omitempty"`
	Healthy   bool     `json:"healthy"`          // it answered a status request
	Leader    bool     `json:"leader,omitempty"` // the raft leader, as it says
	DBBytes   int64    `json:"db_bytes,omitempty"`
	Error     string   `json:"error,omitempty"` // why it is not healthy
}

// memberTimeout bounds each member's status request: a status tool must
// answer even when a member is gone.
const memberTimeout = 2 * time.Second

// ReadStoreMembers fills s.Store, or s.StoreError, from the store behind
// c. It is the status command's own read, kept out of ReadStatus, which the
// agents also call while a job runs: it asks every member for its status.
func (s *Status) ReadStoreMembers(ctx context.Context, c *store.Client) {
	cli := c.Etcd()
	var err error
	if s.Store, err = readStoreMembers(ctx, cli, cli.Endpoints()); err != nil {
		s.StoreError = err.Error()
	}
}

// readStoreMembers lists the store's members and their status. Each
// endpoint the client dials is asked first: its answer names the member
// behind it. A member none of them is, is asked at its client URLs. An
// embedded etcd started on port 0 advertises port 0 (it learns its port
// too late), so the dialed endpoints are the ones to trust.
func readStoreMembers(ctx context.Context, cli *clientv3.Client, dialed []string) ([]StoreMember, error) {
	mctx, cancel := context.WithTimeout(ctx, memberTimeout)
	defer cancel()
	resp, err := cli.MemberList(mctx)
	if err != nil {
		return nil, fmt.Errorf("list the store's members: %w", err)
	}
	type answer struct {
		ep string
		st *clientv3.StatusResponse
	}
	ask := func(ep string) (*clientv3.StatusResponse, error) {
		sctx, cancel := context.WithTimeout(ctx, memberTimeout)
		defer cancel()
		return cli.Status(sctx, ep)
	}
	byID := map[uint64]answer{}
	var silent []string // dialed endpoints that did not answer
	for _, ep := range hostsOf(dialed) {
		st, err := ask(ep)
		if err != nil {
			silent = append(silent, ep)
			continue
		}
		byID[st.Header.MemberId] = answer{ep, st}
	}
	out := make([]StoreMember, 0, len(resp.Members))
	unresolved := 0
	for _, m := range resp.Members {
		sm := StoreMember{Name: m.Name, ID: fmt.Sprintf("%x", m.ID), Learner: m.IsLearner}
		a, ok := byID[m.ID]
		if !ok {
			sm.Error = "does not answer at any endpoint known"
			for _, ep := range memberTargets(m.ClientURLs) {
				st, err := ask(ep)
				if err != nil {
					sm.Endpoints, sm.Error = append(sm.Endpoints, ep), err.Error()
					continue
				}
				a, ok = answer{ep, st}, true
				break
			}
		}
		if ok {
			sm.Endpoints, sm.Healthy, sm.Error = []string{a.ep}, true, ""
			sm.Leader, sm.DBBytes = a.st.Leader == m.ID, a.st.DbSize
		} else if len(sm.Endpoints) == 0 {
			unresolved++
		}
		out = append(out, sm)
	}
	// One silent member and one silent endpoint: that is where it was.
	if unresolved == 1 && len(silent) == 1 {
		for i := range out {
			if !out[i].Healthy && len(out[i].Endpoints) == 0 {
				out[i].Endpoints = silent
			}
		}
	}
	return out, nil
}

// hostsOf strips the scheme the client's endpoints may carry.
func hostsOf(eps []string) []string {
	out := make([]string, 0, len(eps))
	for _, ep := range eps {
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			ep = u.Host
		}
		out = append(out, ep)
	}
	return out
}

// memberTargets are a member's client URLs as host:port, those on port 0
// (not its real port) left out.
func memberTargets(urls []string) []string {
	var out []string
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" || u.Port() == "0" {
			continue
		}
		out = append(out, u.Host)
	}
	return out
}
