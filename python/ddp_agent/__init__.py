"""ddp_agent: DDP gradient all-reduce through libddpshim.so, the data plane of ddp-agent.

Two lines in a training script:

    import ddp_agent
    hook = ddp_agent.register(ddp_model)   # after DistributedDataParallel(...)
    ...
    hook.close()                           # before dist.destroy_process_group()

CPU buckets go through the shim's host transport, CUDA buckets through its
NCCL transport (the NCCL PyTorch loaded, else ``libnccl.so.2``, else
``$DDP_AGENT_NCCL_LIB``), with optional fp16/bf16 compression;
``ddp_agent.info()`` says what this process would use.

Works under ``ddp-agent run`` (bootstrap through the agent's control socket)
and under plain ``torchrun`` (bootstrap through torch's default store), on
PyTorch 1.13 through 2.x. The shared library is found through
``$DDP_AGENT_SHIM`` (ddp-agent sets it for its workers), else next to this
package. torch is required but not declared as a dependency: install the
PyTorch your platform needs first.
"""

__version__ = "0.1.0"

from ._shim import DType, Op, ShimError, Status, nccl_info
from ._shim import library_path as shim_path
from ._shim import version as shim_version
from ._buckets import BucketInfo
from ._info import info
from .hook import Hook, register

__all__ = [
    "BucketInfo",
    "DType",
    "Hook",
    "Op",
    "ShimError",
    "Status",
    "__version__",
    "info",
    "nccl_info",
    "register",
    "shim_path",
    "shim_version",
]
