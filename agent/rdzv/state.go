// Package rdzv is the rendezvous between the agents of one job: it decides
// which nodes take part in each generation of the job, gives every node a
// stable group rank, and turns a fault anywhere (a failed worker, a lost
// node) into a new generation that every agent sees at once.
//
// The store is etcd v3. Everything one job keeps there lives under
// Prefix(id); the layout is part of the contract with `ddp-agent status`
// and with agents of other versions, so it changes only with a new prefix.
//
//	<prefix>job                 JobInfo, written once by the first agent
//	<prefix>state               State: the generation, its phase and members
//	<prefix>nodes/<node>        NodeInfo of each live agent, on its lease
//	<prefix>stalls/<node>       the slow collectives its agent saw (telemetry.Report, opaque here), on its lease
//	<prefix>rounds/<gen>/<node> JoinInfo: the node asks to join round <gen>, on its lease
//	<prefix>leaders/<gen>       the join key of round <gen>'s leader, on its lease
//	<prefix>members/<gen>/<by>  the members of round <gen> as closed by node <by>, a JSON list
//	<prefix>assign/<gen>/<by>/<node> one member of that list: each node reads only its own
//	<prefix>done/<gen>/<node>   the node's workers of generation <gen> all finished
//	<prefix>kv/<job>/<gen>/<key> the workers' bootstrap keys (control socket KVSet/KVGet)
//	HostKey                     in an embedded store: the job id it was started for
package rdzv

import (
	"encoding/json"
	"fmt"
	"regexp"
	"time"
)

// RootPrefix is where every job's keys live, unless rdzv-conf's etcd_prefix
// says otherwise.
const RootPrefix = "/ddp-agent/v1/"

// HostKey holds, in an etcd embedded by an agent, the id of the job that
// agent hosts it for, so an agent of another job is refused at once
// instead of waiting out its join timeout alone.
const HostKey = RootPrefix + "host"

var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// CheckID returns an error unless id can name a job in the store.
func CheckID(id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("rendezvous id %q: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit", id)
	}
	return nil
}

// Prefix is the key prefix of job id under root (RootPrefix by default).
func Prefix(root, id string) string { return root + id + "/" }

// Keys of one job, relative to its prefix.
const (
	jobKey     = "job"
	stateKey   = "state"
	nodesDir   = "nodes/"
	stallsDir  = "stalls/" // not under nodes/: every key there is taken for a node
	roundsDir  = "rounds/"
	kvDir      = "kv/"
	doneDir    = "done/"
	leadersDir = "leaders/"
	membersDir = "members/"
	assignDir  = "assign/"
)

// genKey formats a generation so that keys sort in generation order.
func genKey(gen uint64) string { return fmt.Sprintf("%020d", gen) }

// RoundPrefix is the prefix of the join keys of round gen.
func RoundPrefix(prefix string, gen uint64) string { return prefix + roundsDir + genKey(gen) + "/" }

// KVPrefix is the prefix under which the workers keep their bootstrap
// keys; the control socket adds "<job>/<generation>/".
func KVPrefix(prefix string) string { return prefix + kvDir }

// Phase is where the job's current generation stands.
type Phase string

const (
	// Joining: the round of this generation is open; nodes are joining.
	Joining Phase = "joining"
	// Running: the round closed; Members run their workers.
	Running Phase = "running"
	// Failed: the job failed (no restarts left); every agent exits non-zero.
	Failed Phase = "failed"
	// Succeeded: every member's workers of this generation finished.
	Succeeded Phase = "succeeded"
)

// JobInfo is written once, by the agent that creates the job.
type JobInfo struct {
	ID          string    `json:"id"`
	Created     time.Time `json:"created"`
	NNodesMin   int       `json:"nnodes_min"`
	NNodesMax   int       `json:"nnodes_max"`
	MaxRestarts int       `json:"max_restarts"`
	// TokenMAC is HMAC-SHA256(token, "ddp-agent rendezvous "+ID) in hex, or
	// empty for a job without a token. The token itself is never stored.
	TokenMAC string `json:"token_mac,omitempty"`
}

// Member is one node of a closed round.
type Member struct {
	Node       string `json:"node"`        // node id (NodeInfo.Node)
	Host       string `json:"host"`        // hostname
	Addr       string `json:"addr"`        // address other nodes reach it at
	GroupRank  int    `json:"group_rank"`  // GROUP_RANK of its workers
	NProc      int    `json:"nproc"`       // its workers
	RankOffset int    `json:"rank_offset"` // RANK of its local rank 0
}

// State is the job's current generation. Every change to it is a
// compare-and-swap on its revision, so exactly one agent moves the job on.
type State struct {
	Generation uint64 `json:"generation"`
	Phase      Phase  `json:"phase"`
	// Run names this run of the job (newRunID), made with the job and with
	// each new run of it, kept by every other change: trace ids derive from
	// it. States written before it existed lack it ("").
	Run    string `json:"run,omitempty"`
	Reason string `json:"reason,omitempty"` // why this generation began (or why the job failed)
	// End is Reason typed: what ended the last generation and the node
	// concerned. States written before it existed lack it (EndUnknown).
	End   RoundEnd  `json:"end,omitzero"`
	Since time.Time `json:"since"` // when Phase was entered
	// Failures counts the generations that began because of a fault (a
	// worker failure, a lost node); scale events do not count. The job
	// fails when a fault would make it exceed MaxRestarts.
	Failures    int `json:"failures"`
	MaxRestarts int `json:"max_restarts"`
	// Owed: a node was lost while the workers may carry on past it in
	// process (LastStore set), which is no restart; whether they do is
	// known when this round closes (Carry), which then counts the failure
	// if they do not.
	Owed bool `json:"owed,omitempty"`
	// NNodes: when Running, how many nodes this generation has. The
	// members themselves are under MembersKey (the list) and AssignPrefix
	// (one key per node): every agent watches this key, and a list of 1000
	// nodes in it would reach every agent at every change. When Joining,
	// the keys are those of the last closed round, so survivors keep their
	// group ranks.
	NNodes       int    `json:"nnodes,omitempty"`
	MembersKey   string `json:"members_key,omitempty"`
	AssignPrefix string `json:"assign_prefix,omitempty"`
	// Members, when set, is the member list itself (states written by
	// hand or by tests; agents write the keys above).
	Members    []Member `json:"members,omitempty"`
	WorldSize  int      `json:"world_size,omitempty"`
	MasterAddr string   `json:"master_addr,omitempty"`
	MasterPort int      `json:"master_port,omitempty"`
	// AgentStore: group rank 0's agent serves the workers' store, not
	// rank 0's worker (its --spares; TORCHELASTIC_USE_AGENT_STORE).
	AgentStore bool `json:"agent_store,omitempty"`
	// MasterNode is group rank 0's node id.
	MasterNode string `json:"master_node,omitempty"`
	// Carry: the workers of the last round may carry on into this one in
	// their processes (agent/keep.go), and new workers join them there:
	// the job's nodes changed (one lost, left or joined, no worker's
	// fault), and both rounds' workers' stores are served by agents (the
	// same store where its node stayed). LastStore is the last round's
	// store while this one is open ("node:port"; "" when no agent served
	// it, or it never ran).
	Carry     bool   `json:"carry,omitempty"`
	LastStore string `json:"last_store,omitempty"`
	// PlainNodes names the members whose agents serve no workers' store
	// (no --spares) where the others' do ("node a", "nodes a, b and 3
	// more"; "" when all agree). Their workers can neither wait in a
	// re-formation nor join one, so no round with them carries workers on.
	PlainNodes string `json:"plain_nodes,omitempty"`
}

// Nodes is how many nodes the generation has.
func (s *State) Nodes() int { return max(s.NNodes, len(s.Members)) }

// Member returns the member with node id node, if any, from Members.
func (s *State) Member(node string) (Member, bool) {
	for _, m := range s.Members {
		if m.Node == node {
			return m, true
		}
	}
	return Member{}, false
}

// NodeState is what an agent is doing, as it tells the others.
type NodeState string

const (
	NodeActive    NodeState = "active"    // joining or running workers
	NodeSucceeded NodeState = "succeeded" // its workers finished; it leaves soon
	NodeLeft      NodeState = "left"      // it gave up or was stopped; it leaves now
)

// NodeInfo is an agent's entry, on its lease: it disappears when the agent
// dies or its node is cut off.
type NodeInfo struct {
	Node    string    `json:"node"`
	Host    string    `json:"host"`
	Addr    string    `json:"addr"`
	PID     int       `json:"pid"`
	NProc   int       `json:"nproc"`
	Lease   int64     `json:"lease"` // etcd lease id
	Probe   string    `json:"probe"` // host:port that refuses connections once the agent is gone
	State   NodeState `json:"state"`
	Reason  string    `json:"reason,omitempty"` // for NodeLeft
	Started time.Time `json:"started"`
	// GPUs is what the agent found of its GPUs and where it placed its
	// workers; nil on a node without NVML.
	GPUs *NodeGPUs `json:"gpus,omitempty"`
}

// NodeGPUs is one node's GPUs and its workers' placement, for status.
type NodeGPUs struct {
	Summary string      `json:"summary"`      // nvml.Topology.Summary
	Binding string      `json:"numa_binding"` // none, node, exclusive
	Ring    []int       `json:"ring"`         // NVML indexes in CUDA device order
	Workers []WorkerGPU `json:"workers"`      // by local rank
}

// WorkerGPU is where one local rank runs.
type WorkerGPU struct {
	LocalRank int    `json:"local_rank"`
	GPU       int    `json:"gpu"` // NVML index, -1: none
	UUID      string `json:"uuid,omitempty"`
	CPUs      string `json:"cpus,omitempty"` // bound CPUs, "" when not bound
	MemNode   int    `json:"mem_node"`       // NUMA node of its memory policy, -1: none
}

// JoinInfo is a node's request to join one round.
type JoinInfo struct {
	Node       string    `json:"node"`
	Host       string    `json:"host"`
	Addr       string    `json:"addr"`
	NProc      int       `json:"nproc"`
	MasterPort int       `json:"master_port"`           // the workers' store port, if it becomes group rank 0
	AgentStore bool      `json:"agent_store,omitempty"` // and whether its agent would serve it
	Joined     time.Time `json:"joined"`
}

// decode unmarshals a value read from the store. The store is shared
// with other agents and tools, so a value that does not parse is an error
// that names the key, never a crash.
func decode(key string, raw []byte, v any) error {
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("malformed value at %s: %w", key, err)
	}
	return nil
}

func encode(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("rdzv: encode %T: %v", v, err)) // our own types always marshal
	}
	return string(b)
}
