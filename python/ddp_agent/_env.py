"""Every environment variable the package reads, named once (the Go side's table is internal/envname).

The agent sets the first group in each worker's environment; a user sets the
second. Modules read them through these names, never through literals, so a
rename is one line and a test (tests/test_env_names.py) keeps it that way.
"""

# Set by ddp-agent (run mode) for its workers.
SOCKET = "DDP_AGENT_SOCKET"  # the agent's control socket (also the sidecar's, when the user sets it)
GENERATION = "DDP_AGENT_GENERATION"  # the job's generation: set only under `ddp-agent run`
BOOTSTRAP = "DDP_AGENT_BOOTSTRAP"  # "external": the communicators bootstrap through torch's store
STACK_DIR = "DDP_AGENT_STACK_DIR"  # where a hang report's Python stacks are written
SPARE_FD = "DDP_AGENT_SPARE_FD"  # a warm spare's only: the fd it reads its rank from (--spares)
SPARE_READY_FD = "DDP_AGENT_SPARE_READY_FD"  # a process started warm before its node joins: the fd it says ready on
WORLD_FILE = "DDP_AGENT_WORLD_FILE"  # under --spares: the new world the workers carry on into (InProcess)
JOIN = "DDP_AGENT_JOIN"  # a new worker that joins the others' re-formation in process (_spare)

# Set by the user.
SHIM = "DDP_AGENT_SHIM"  # libddpshim.so to load instead of the bundled one
SHIM_CONFIG = "DDP_AGENT_SHIM_CONFIG"  # JSON object of extra communicator config keys
NCCL_LIB = "DDP_AGENT_NCCL_LIB"  # an NCCL to load when the process has none
COLLECTIVE_TIMEOUT = "DDP_AGENT_COLLECTIVE_TIMEOUT"  # register()'s default timeout, in seconds
PYTHON = "DDP_AGENT_PYTHON"  # the interpreter the console command's ddp-agent runs workers with
HOOK_LAUNCH = "DDP_AGENT_HOOK_LAUNCH"  # register()'s default launch: "inline" or "thread"
