package rdzv

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// assignment returns node's membership in the round of st, reading only
// that node's key.
func (e *Membership) assignment(ctx context.Context, st *State, node string) (Member, bool, error) {
	if st.AssignPrefix == "" {
		m, ok := st.Member(node)
		return m, ok, nil
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	key := st.AssignPrefix + node
	resp, err := e.cli.Get(ctx, key)
	if err != nil {
		return Member{}, false, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	if len(resp.Kvs) == 0 {
		return Member{}, false, nil
	}
	var m Member
	if err := decode(key, resp.Kvs[0].Value, &m); err != nil || m.Node != node || m.GroupRank < 0 || m.GroupRank >= st.Nodes() || m.NProc < 1 {
		e.log.Warn("ignoring a malformed assignment", "key", key, "err", err)
		return Member{}, false, nil
	}
	return m, true, nil
}

// members returns the member list of the round of st (of the last closed
// round when st is Joining). opts are the read's (clientv3.WithSerializable
// for a reader that must not wait for a quorum).
func (e *Membership) members(ctx context.Context, st *State, opts ...clientv3.OpOption) ([]Member, error) {
	if st.MembersKey == "" {
		return st.Members, nil
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, st.MembersKey, opts...)
	if err != nil {
		return nil, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil // swept by a later round
	}
	var ms []Member
	if err := decode(st.MembersKey, resp.Kvs[0].Value, &ms); err != nil {
		e.log.Warn("ignoring a malformed member list", "err", err)
		return nil, nil
	}
	return ms, nil
}

// missingMembers returns the members of st whose node keys are gone.
func (e *Membership) missingMembers(ctx context.Context, st *State) ([]Member, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.key(nodesDir), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	live := map[string]bool{}
	for _, kv := range resp.Kvs {
		live[strings.TrimPrefix(string(kv.Key), e.key(nodesDir))] = true
	}
	members, err := e.members(ctx, st)
	if err != nil {
		return nil, err
	}
	var gone []Member
	for _, m := range members {
		if !live[m.Node] {
			gone = append(gone, m)
		}
	}
	return gone, nil
}
