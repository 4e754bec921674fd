// Package envname names every DDP_AGENT_* environment variable the Go side
// reads or sets, once (the Python package's table is
// python/ddp_agent/_env.py). Code uses these constants, never literals; the
// test beside this file fails on a literal anywhere else in the module.
package envname

// Set by `ddp-agent run` in each worker's environment (the shim and the
// ddp_agent package read them).
const (
	// Socket is the control socket's path: the agent's under run, the
	// sidecar's when a user points workers at one.
	Socket = "DDP_AGENT_SOCKET"
	// Generation is the job's generation; set only under `ddp-agent run`.
	Generation = "DDP_AGENT_GENERATION"
	// Bootstrap "external" tells the hook to bootstrap its communicators
	// through torch's store (the agent's store is node-local).
	Bootstrap = "DDP_AGENT_BOOTSTRAP"
	// CommNoteFile is where the shim notes how its communicator ended.
	CommNoteFile = "DDP_AGENT_COMM_NOTE_FILE"
	// StackDir is where a hung rank's Python stacks are written.
	StackDir = "DDP_AGENT_STACK_DIR"
	// GPU is the UUID of the worker's GPU.
	GPU = "DDP_AGENT_GPU"
	// Instance is set by ddp-agent (run and sidecar) for every process it
	// starts, workers and plugins, and so inherited by theirs: the ids of
	// the agents (an agent inside a worker adds its own) whose processes
	// these are. An agent's guard kills every process that carries its
	// id once the agent is gone (agent/guard).
	Instance = "DDP_AGENT_INSTANCE"
	// SpareFD is set only for a warm spare (--spares): the descriptor
	// from which it reads the rank it takes.
	SpareFD = "DDP_AGENT_SPARE_FD"
	// SpareReadyFD is set only for a process the agent starts warm before
	// its node joins the rendezvous: the descriptor it writes one byte to,
	// and closes, once its imports are done (supervisor.Group.StartWarm).
	SpareReadyFD = "DDP_AGENT_SPARE_READY_FD"
	// WorldFile is set under --spares: the file where the agent writes
	// the world of a later generation that the workers carry on into, in
	// process, when a node was lost (ddp_agent.InProcess reads it).
	WorldFile = "DDP_AGENT_WORLD_FILE"
	// Join is set for workers that start to join the others' re-formation
	// in process, which carry on from the last generation (a node joined
	// or was lost): they run as warm spares given their rank at once.
	Join = "DDP_AGENT_JOIN"
)

// Set by a user (or a launcher) for the agent, the shim or the plugins.
const (
	// Shim is the libddpshim.so the workers load; the agent sets it to the
	// one beside its executable when unset.
	Shim = "DDP_AGENT_SHIM"
	// NCCLLib and CUDALib name an NCCL and a CUDA driver to load when the
	// process and the loader have none.
	NCCLLib = "DDP_AGENT_NCCL_LIB"
	CUDALib = "DDP_AGENT_CUDA_LIB"
	// Python is the workers' interpreter when --python is not given.
	Python = "DDP_AGENT_PYTHON"
	// RdzvToken is --rdzv-token, kept out of argv.
	RdzvToken = "DDP_AGENT_RDZV_TOKEN"
	// Plugins is more --plugin specs; PluginDir where plugins are found.
	Plugins   = "DDP_AGENT_PLUGINS"
	PluginDir = "DDP_AGENT_PLUGIN_DIR"
	// PluginCookie is go-plugin's magic cookie key between the agent and
	// its plugins.
	PluginCookie = "DDP_AGENT_PLUGIN"
	// Topology is a topology file that replaces NVML's (tests, demos).
	Topology = "DDP_AGENT_TOPOLOGY"
	// MockThrottle makes the nvmlmock build's GPU of that rank throttle.
	MockThrottle = "DDP_AGENT_MOCK_THROTTLE"
)
