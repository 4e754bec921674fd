#!/usr/bin/env bash
# GPU verification of ddp_agent's NCCL transport, on a machine with one NVIDIA GPU.
#
#   examples/gpu_check.sh [--steps 50] [--timing-steps 200] [--json OUT] [--trace OUT] [--only a,b]
#   examples/gpu_check.sh --dry-run [...]   arguments, imports, the shim and its NCCL; no GPU needed
#   PYTHON=/opt/venv/bin/python examples/gpu_check.sh --json /tmp/gpu_check.json
#
# Builds nothing (the GPU machine may have no Go): it uses bin/libddpshim.so as
# it is, built elsewhere with `make build` and copied along with the repository.
# Prints what it runs on (GPUs, torch, NCCL, ddp_agent.info()), then runs
# examples/gpu_check.py as one rank of a one-GPU job, with the environment
# torchrun gives a single worker (WORLD_SIZE=1, RANK=0, MASTER_ADDR=127.0.0.1,
# a free MASTER_PORT). The arguments go to gpu_check.py.
#
# Exit status: 0 every check passed (with --dry-run: all is ready short of
# the GPU); 1 a check failed; 2 it cannot run here (no python, no torch, no
# CUDA device, no bin/libddpshim.so, a bad argument).
# $DDP_AGENT_SHIM, when set, names the library instead of bin/libddpshim.so.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
SHIM="$(realpath -m "${DDP_AGENT_SHIM:-$ROOT/bin/libddpshim.so}")"
cd "$ROOT"
DRY_RUN=0
for a in "$@"; do [[ $a == --dry-run ]] && DRY_RUN=1; done

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "gpu_check.sh: python '$PYTHON' not found; set PYTHON to an interpreter with PyTorch" >&2
  exit 2
fi
if [[ ! -f "$SHIM" ]]; then
  echo "gpu_check.sh: $SHIM is missing. This script builds nothing: run \`make build\`" \
    "(Go and gcc) on a machine that has them and copy bin/libddpshim.so here." >&2
  exit 2
fi

# As python/tests/conftest.py does: the in-tree package first on the path,
# the library named by $DDP_AGENT_SHIM (absolute, whatever the cwd).
export DDP_AGENT_SHIM="$SHIM"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

echo "== nvidia-smi -L"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L || echo "(nvidia-smi -L failed)"
else
  echo "(nvidia-smi not found)"
fi

echo "== torch, NCCL, ddp_agent.info(transport='nccl')"
rc=0
"$PYTHON" - <<'EOF' || rc=$?
import json
import sys

try:
    import torch
except Exception as e:  # ImportError, or a broken install
    print(f"gpu_check.sh: torch cannot be imported by {sys.executable}: {e}", file=sys.stderr)
    sys.exit(2)
print(f"python {sys.version.split()[0]} ({sys.executable})")
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, CUDA available {torch.cuda.is_available()}, "
      f"devices {torch.cuda.device_count() if torch.cuda.is_available() else 0}")
try:
    print(f"torch.cuda.nccl.version() {torch.cuda.nccl.version()}")
except Exception as e:  # a build without NCCL
    print(f"torch.cuda.nccl.version() failed: {e}")
import ddp_agent

print(f"ddp_agent {ddp_agent.__version__} from {ddp_agent.__file__}")
print(json.dumps(ddp_agent.info(transport="nccl"), indent=2, sort_keys=True))
EOF
if [[ $rc -ne 0 ]]; then
  echo "gpu_check.sh: the environment check above failed (exit $rc); nothing was run" >&2
  exit 2
fi

# One rank on this one GPU, set up as torchrun would for --nproc-per-node 1.
MASTER_PORT="${MASTER_PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
export WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT

echo "== examples/gpu_check.py $* (rank 0 of 1, MASTER_PORT=$MASTER_PORT)"
rc=0
"$PYTHON" "$ROOT/examples/gpu_check.py" "$@" || rc=$?
case $rc in
  0) if [[ $DRY_RUN == 1 ]]; then echo "gpu_check.sh: dry run passed: ready for a GPU"; else echo "gpu_check.sh: every check passed"; fi ;;
  2) echo "gpu_check.sh: gpu_check.py cannot run here (exit 2)" >&2 ;;
  *) echo "gpu_check.sh: some check failed (exit $rc)" >&2 ;;
esac
exit "$rc"
