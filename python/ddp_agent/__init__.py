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

# Nothing is imported until asked for (PEP 562): the wheel's ``ddp-agent``
# command imports this package on its way to exec the Go binary, and must
# work, in milliseconds, where torch is absent (a login node, a slim sidecar
# image). Importing torch cost every call 2-3.5 s.
_LAZY = {
    "BucketInfo": ("._buckets", "BucketInfo"),
    "DType": ("._shim", "DType"),
    "Hook": (".hook", "Hook"),
    "InProcess": (".inprocess", "InProcess"),
    "Op": ("._shim", "Op"),
    "ShimError": ("._shim", "ShimError"),
    "Status": ("._shim", "Status"),
    "info": ("._info", "info"),
    "nccl_info": ("._shim", "nccl_info"),
    "register": (".hook", "register"),
    "shim_path": ("._shim", "library_path"),
    "shim_version": ("._shim", "version"),
}

__all__ = sorted([*_LAZY, "__version__"])


def __getattr__(name):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__():
    return __all__
