"""ddp_agent.info(): what this process has to offer the hook, for logs and bug reports."""

from typing import Any, Dict

import torch

from . import _shim
from ._options import TRANSPORTS
from ._shim import ShimError


def info(transport: str = "auto") -> Dict[str, Any]:
    """Returns what this process has to offer the hook, for logs and bug reports.

    A dict: ``version`` (this package's), ``shim`` (path, and version or
    error), ``nccl`` (:func:`ddp_agent._shim.nccl_info`: found, source,
    version, features, or error), ``torch`` (version, CUDA build, whether
    CUDA is available, device count, and PyTorch's own NCCL version when CUDA
    is), and ``transport``: for register(transport=...), what a ``cpu`` and
    a ``cuda`` bucket would go through ("host", "nccl", "torch.distributed",
    or None where the hook raises), with ``why`` when not the shim's. Only
    this process is looked at; the hook decides with every rank's answer.

    Loads the library and NCCL (blocks for dlopen); never raises for a
    missing library or NCCL (it says so instead); never initializes CUDA.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"ddp_agent.info: transport={transport!r}; use one of {', '.join(TRANSPORTS)}")
    from . import __version__

    out: Dict[str, Any] = {"version": __version__}
    shim: Dict[str, Any] = {"path": _shim.library_path()}
    nccl: Dict[str, Any]
    try:
        shim["version"] = _shim.version()
        nccl = _shim.nccl_info()
    except ShimError as e:
        shim.setdefault("error", str(e))
        nccl = {"found": False, "error": str(e)}
    out["shim"], out["nccl"] = shim, nccl

    cuda = torch.cuda.is_available()  # does not initialize CUDA
    tinfo: Dict[str, Any] = {
        # str(): torch 2.x's TorchVersion is a str subclass that
        # torch.load(weights_only=True), its default since 2.6, refuses.
        "version": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cuda_available": cuda,
        "devices": torch.cuda.device_count() if cuda else 0,
    }
    if cuda:
        try:
            v = torch.cuda.nccl.version()
            tinfo["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:  # a build without NCCL
            tinfo["nccl"] = f"none ({e})"
    out["torch"] = tinfo

    found = bool(nccl.get("found"))
    why = "" if found else f"NCCL cannot be loaded: {nccl.get('error') or 'not found'}"
    if transport == "host":
        route = {"cpu": "host", "cuda": None, "why": "transport 'host' refuses CUDA buckets"}
    elif transport == "nccl":
        route = {"cpu": "nccl", "cuda": "nccl", "why": "CPU buckets need an NCCL that works on host memory"}
        if not found:
            route = {"cpu": None, "cuda": None, "why": why}
    else:
        route = {"cpu": "host", "cuda": "nccl" if found else "torch.distributed"}
        if not found:
            route["why"] = why
    if "error" in shim:
        route = {"cpu": None, "cuda": None, "why": f"register() fails: {shim['error']}"}
    out["transport"] = dict(requested=transport, **route)
    return out
