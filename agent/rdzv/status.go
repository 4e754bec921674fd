package rdzv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// This file reads a job for `ddp-agent status`. It only reads: a status
// tool must never change what the agents see. Everything one answer shows
// comes from one revision of the store, so the job, its state and its
// nodes agree with each other.

// ErrNoJob: the store holds nothing for the job.
var ErrNoJob = errors.New("no such job in the store")

// Role is what a node is doing in the job, as status shows it. It combines
// the state's members, the live node entries and the open round's join
// keys; it is not stored anywhere.
type Role string

const (
	RoleRunning   Role = "running"   // a member of the running generation; its agent is live
	RoleLost      Role = "lost"      // a member (of the running or last round) whose node entry is gone: agent dead or cut off
	RoleSpare     Role = "spare"     // live but not a member: the job is full (or it is about to ask for a rescale)
	RoleJoined    Role = "joined"    // has joined the open round
	RoleJoining   Role = "joining"   // live, has not joined the open round yet: the round awaits it
	RoleSucceeded Role = "succeeded" // its workers finished (node state succeeded)
	RoleLeft      Role = "left"      // it gave up or was stopped (node state left)
	RoleActive    Role = "active"    // live while the job is over, or its state is unreadable
	RoleGone      Role = "gone"      // a member whose agent left after the job ended
	RoleMalformed Role = "malformed" // its node entry does not parse
)

// Status is one job as the store held it at one revision. Its JSON form is
// what `ddp-agent status --json` prints (the command adds "store", the
// endpoints it read), and its field names are stable:
//
//	id         the job id
//	revision   the store revision everything was read at
//	hosted     the store is an agent's embedded etcd, started for this job
//	job        JobInfo (nnodes_min, nnodes_max, max_restarts, created, ...);
//	           null when missing or malformed
//	state      State (generation, phase, reason, since, failures,
//	           max_restarts, members, world_size, master_addr,
//	           master_port); null when missing or malformed
//	nodes      one object per node, members first by group rank, then
//	           joiners in join order, then the others by node id:
//	             node       node id
//	             role       a Role: running, lost, spare, joined, joining,
//	                        succeeded, left, active, gone, malformed
//	             member     its Member in state.members, if any (group_rank,
//	                        rank_offset, nproc, host, addr)
//	             entry      its NodeInfo (nodes/<node>), if its agent is
//	                        registered (pid, host, addr, state, reason,
//	                        gpus: NodeGPUs, its GPUs and its workers'
//	                        placement, absent on a node without NVML, ...)
//	             join       its JoinInfo in the open round, if it joined
//	             stalls     its agent's stalls report (stalls/<node>), if
//	                        it published one, as stored: a
//	                        telemetry.Report, opaque to this package:
//	                        updated, stalls (the last stall reports, one
//	                        line each, newest last), stragglers ([{rank,
//	                        host, gpu, last, steps, ...}]: persistent
//	                        stragglers, last in <last> of the last <steps>
//	                        steps), hang (the first line of the last hang
//	                        report, absent when none)
//	             malformed  why its node entry did not parse
//	malformed  every value that did not parse: [{"key", "error"}]
//	store_members  the store's etcd members: [{name, id, endpoints,
//	           learner, healthy, leader, db_bytes, error}]
//	store_error    why the members could not be listed, if so
type Status struct {
	ID        string           `json:"id"`
	Revision  int64            `json:"revision"`
	Hosted    bool             `json:"hosted"`
	Job       *JobInfo         `json:"job"`
	State     *State           `json:"state"`
	Nodes     []NodeStatus     `json:"nodes"`
	Malformed []MalformedValue `json:"malformed,omitempty"`
	// Store lists the store's etcd members, their health and the leader
	// (status_store.go, ReadStoreMembers); StoreError says why they could
	// not be listed.
	Store      []StoreMember `json:"store_members,omitempty"`
	StoreError string        `json:"store_error,omitempty"`
}

// NodeStatus is one node of a Status; see Status for its JSON form.
type NodeStatus struct {
	Node      string          `json:"node"`
	Role      Role            `json:"role"`
	Member    *Member         `json:"member,omitempty"`
	Entry     *NodeInfo       `json:"entry,omitempty"`
	Join      *JoinInfo       `json:"join,omitempty"`
	Stalls    json.RawMessage `json:"stalls,omitempty"` // telemetry.Report's JSON, compacted; nil when none
	Malformed string          `json:"malformed,omitempty"`
	// Finished: a member whose workers of the running generation all
	// finished (its done marker, which outlives its agent): without a node
	// entry its agent went home, it is not lost.
	Finished bool `json:"finished,omitempty"`

	joinRev int64 // create revision of its join key: the join order
}

// Host is the node's hostname from whichever record has it.
func (n NodeStatus) Host() string {
	switch {
	case n.Member != nil:
		return n.Member.Host
	case n.Entry != nil:
		return n.Entry.Host
	case n.Join != nil:
		return n.Join.Host
	}
	return ""
}

// Addr is the address the other nodes reach it at.
func (n NodeStatus) Addr() string {
	switch {
	case n.Member != nil:
		return n.Member.Addr
	case n.Entry != nil:
		return n.Entry.Addr
	case n.Join != nil:
		return n.Join.Addr
	}
	return ""
}

// MalformedValue is a value in the store that did not parse.
type MalformedValue struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

// Joined counts the nodes that joined the open round.
func (s *Status) Joined() int {
	n := 0
	for _, ns := range s.Nodes {
		if ns.Join != nil {
			n++
		}
	}
	return n
}

// ReadStatus reads job id under root (RootPrefix, or rdzv-conf's
// etcd_prefix) in one transaction. It returns ErrNoJob when the store holds
// neither the job, its state nor a node of it. Malformed values are listed
// in Status.Malformed, never an error: the store is shared, and a status
// tool is what one runs to find such a thing.
func ReadStatus(ctx context.Context, c *store.Client, root, id string) (*Status, error) {
	cli := c.Etcd()
	prefix := Prefix(root, id)
	k, err := readJobKeys(ctx, cli, prefix)
	if err != nil {
		return nil, fmt.Errorf("read job %q: %w", id, err)
	}
	if len(k.job) == 0 && len(k.state) == 0 && len(k.nodes) == 0 {
		return nil, ErrNoJob
	}
	s := &Status{ID: id, Revision: k.rev, Nodes: []NodeStatus{}}
	s.Hosted = len(k.host) > 0 && string(k.host[0].Value) == id
	s.decodeJob(prefix, k.job)
	s.decodeState(prefix, k.state)
	if s.State != nil && len(s.State.Members) == 0 && s.State.MembersKey != "" {
		// The agents keep the member list out of the state key; read it
		// at the same revision, so the picture stays one moment's.
		mresp, err := cli.Get(ctx, s.State.MembersKey, clientv3.WithRev(k.rev))
		switch {
		case err != nil:
			return nil, fmt.Errorf("read %s: %w", s.State.MembersKey, err)
		case len(mresp.Kvs) > 0:
			if err := decode(s.State.MembersKey, mresp.Kvs[0].Value, &s.State.Members); err != nil {
				s.bad(s.State.MembersKey, err)
			}
		}
	}
	s.collectNodes(prefix, k)
	return s, nil
}

// jobKeys is what ReadStatus reads of one job in one transaction.
type jobKeys struct {
	rev                                     int64
	job, state, nodes, rounds, host, stalls []*mvccpb.KeyValue
	done                                    []*mvccpb.KeyValue // keys only
}

func readJobKeys(ctx context.Context, cli *clientv3.Client, prefix string) (*jobKeys, error) {
	// The whole rounds/ dir, since which round is open is only known from
	// the state read in the same transaction; closing a round deletes the
	// ones before it, so it holds one or two rounds.
	resp, err := cli.Txn(ctx).Then(
		clientv3.OpGet(prefix+jobKey),
		clientv3.OpGet(prefix+stateKey),
		clientv3.OpGet(prefix+nodesDir, clientv3.WithPrefix()),
		clientv3.OpGet(prefix+roundsDir, clientv3.WithPrefix()),
		clientv3.OpGet(HostKey),
		clientv3.OpGet(prefix+stallsDir, clientv3.WithPrefix()),
		clientv3.OpGet(prefix+doneDir, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return nil, err
	}
	kvs := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
	return &jobKeys{rev: resp.Header.Revision, job: kvs(0), state: kvs(1), nodes: kvs(2), rounds: kvs(3), host: kvs(4), stalls: kvs(5),
		done: kvs(6)}, nil
}

// bad lists a value that did not parse.
func (s *Status) bad(key string, err error) {
	s.Malformed = append(s.Malformed, MalformedValue{Key: key, Error: err.Error()})
}

func (s *Status) decodeJob(prefix string, kvs []*mvccpb.KeyValue) {
	if len(kvs) == 0 {
		return
	}
	var job JobInfo
	if err := decode(prefix+jobKey, kvs[0].Value, &job); err != nil {
		s.bad(prefix+jobKey, err)
		return
	}
	s.Job = &job
}

func (s *Status) decodeState(prefix string, kvs []*mvccpb.KeyValue) {
	if len(kvs) == 0 {
		return
	}
	var st State
	err := decode(prefix+stateKey, kvs[0].Value, &st)
	if err == nil && !st.Phase.valid() {
		err = fmt.Errorf("malformed value at %s: unknown phase %q", prefix+stateKey, st.Phase)
	}
	if err != nil {
		s.bad(prefix+stateKey, err)
		return
	}
	s.State = &st
}

// collectNodes fills s.Nodes from the members, the node entries, the open
// round's join keys and the stall reports, and gives each node its role.
func (s *Status) collectNodes(prefix string, k *jobKeys) {
	byNode := map[string]*NodeStatus{}
	node := func(id string) *NodeStatus {
		if byNode[id] == nil {
			byNode[id] = &NodeStatus{Node: id}
		}
		return byNode[id]
	}
	if s.State != nil {
		for _, m := range s.State.Members {
			node(m.Node).Member = &m
		}
	}
	for _, kv := range k.nodes {
		key := string(kv.Key)
		n := node(strings.TrimPrefix(key, prefix+nodesDir))
		var info NodeInfo
		if err := decode(key, kv.Value, &info); err != nil {
			s.bad(key, err)
			n.Malformed = err.Error()
			continue
		}
		n.Entry = &info
	}
	if s.State != nil && s.State.Phase == Running {
		gen := prefix + doneDir + genKey(s.State.Generation) + "/"
		for _, kv := range k.done {
			if id, ok := strings.CutPrefix(string(kv.Key), gen); ok && byNode[id] != nil && byNode[id].Member != nil {
				byNode[id].Finished = true
			}
		}
	}
	if s.State != nil && s.State.Phase == Joining {
		open := RoundPrefix(prefix, s.State.Generation)
		for _, kv := range k.rounds {
			key := string(kv.Key)
			if !strings.HasPrefix(key, open) {
				continue // an earlier round, not yet cleaned up
			}
			var j JoinInfo
			if err := decode(key, kv.Value, &j); err != nil {
				s.bad(key, err)
				continue
			}
			n := node(strings.TrimPrefix(key, open))
			n.Join, n.joinRev = &j, kv.CreateRevision
		}
	}
	// Stalls only add to a node known otherwise: they share the lease of
	// its entry, so one alone was written by hand, and would make up a
	// node that status would call lost or spare.
	for _, kv := range k.stalls {
		key := string(kv.Key)
		n := byNode[strings.TrimPrefix(key, prefix+stallsDir)]
		if n == nil {
			continue
		}
		st, err := stallsObject(kv.Value)
		if err != nil {
			s.bad(key, fmt.Errorf("malformed value at %s: %w", key, err))
			continue
		}
		n.Stalls = st
	}

	for _, n := range byNode {
		n.Role = role(s.State, n)
		s.Nodes = append(s.Nodes, *n)
	}
	sortNodes(s.Nodes)
}

// role decides what node n is doing in the job whose state is st (nil
// when unreadable).
func role(st *State, n *NodeStatus) Role {
	if n.Malformed != "" {
		return RoleMalformed
	}
	if n.Entry != nil {
		switch n.Entry.State {
		case NodeSucceeded:
			return RoleSucceeded
		case NodeLeft:
			return RoleLeft
		}
	}
	var phase Phase
	if st != nil {
		phase = st.Phase
	}
	live := n.Entry != nil
	switch phase {
	case Running:
		switch {
		case n.Member != nil && live:
			return RoleRunning
		case n.Member != nil && n.Finished:
			return RoleSucceeded // its agent went home before the others finished
		case n.Member != nil:
			return RoleLost
		}
		return RoleSpare
	case Joining:
		switch {
		case n.Join != nil:
			return RoleJoined
		case live:
			return RoleJoining
		}
		return RoleLost // a member of the last round that will not rejoin
	}
	if !live {
		return RoleGone
	}
	return RoleActive
}

// sortNodes orders members by group rank, then joiners in join order,
// then the rest by node id.
func sortNodes(ns []NodeStatus) {
	sort.Slice(ns, func(i, j int) bool {
		a, b := &ns[i], &ns[j]
		if (a.Member != nil) != (b.Member != nil) {
			return a.Member != nil
		}
		if a.Member != nil && a.Member.GroupRank != b.Member.GroupRank {
			return a.Member.GroupRank < b.Member.GroupRank
		}
		if (a.Join != nil) != (b.Join != nil) {
			return a.Join != nil
		}
		if a.joinRev != b.joinRev {
			return a.joinRev < b.joinRev
		}
		return a.Node < b.Node
	})
}
