"""ctypes binding of libddpshim.so, the C ABI in shim/ddpshim.h.

Every function of the header has its ``argtypes`` and ``restype`` declared
once, in ``PROTOTYPES`` (64-bit handles, pointers and stream handles would
be truncated to 32 bits otherwise). Every failing call raises
:class:`ShimError` carrying the status code and the message that
``ddpshim_last_error()`` returned on the same thread, right after the call.

The library is loaded with ``ctypes.CDLL``, so every call releases the GIL:
a thread blocked in :meth:`Work.wait` does not stop other Python threads.

The library embeds a Go runtime, and a child forked after it was loaded
(a DataLoader worker, say) hangs if it calls into it. After such a fork,
every function here raises :class:`ShimError` in the child instead of
entering the library. Nothing here calls the library from ``__del__`` or a
finalizer: handles are released only by explicit calls.

This module does not import torch.
"""

import ctypes
import enum
import json
import os
import re
import threading
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

from . import _env

__all__ = [
    "ENV_NCCL_LIB",
    "ENV_SHIM",
    "LIBRARY_NAME",
    "PROTOTYPES",
    "Comm",
    "DType",
    "Op",
    "ShimError",
    "Status",
    "Work",
    "library_path",
    "nccl_info",
    "version",
]

ENV_SHIM = _env.SHIM
"""Environment variable naming the library to load (ddp-agent sets it for its workers)."""

LIBRARY_NAME = "libddpshim.so"
"""File name of the library bundled next to this package."""

ENV_NCCL_LIB = _env.NCCL_LIB
"""Environment variable naming the NCCL library the shim tries last (read by the library itself).

The shim takes the NCCL already in the process first (PyTorch's), then
``libnccl.so.2`` from the loader's path, then this path.
"""


class Status(enum.IntEnum):
    """Status codes of the C ABI (DDPSHIM_OK, DDPSHIM_ERR_*)."""

    OK = 0
    INVALID = 1
    CLOSED = 2
    ABORTED = 3
    TIMEOUT = 4
    PEER = 5
    MISMATCH = 6
    UNAVAILABLE = 7
    INTERNAL = 8


class DType(enum.IntEnum):
    """Element types (DDPSHIM_INT32 ... DDPSHIM_BFLOAT16; the values of ncclDataType_t)."""

    INT32 = 2
    INT64 = 4
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9


class Op(enum.IntEnum):
    """Reduction ops (DDPSHIM_SUM, DDPSHIM_AVG; the values of ncclRedOp_t).

    AVG divides the sum by the world size once; integers truncate.
    """

    SUM = 0
    AVG = 4


class Mark(enum.IntEnum):
    """Kinds of ddpshim_mark (DDPSHIM_MARK_*)."""

    FORWARD = 0


class ShimError(RuntimeError):
    """A call into libddpshim.so failed.

    Attributes:
        code: the status code (an int; :class:`Status` names it).
        code_name: the status's symbolic name, such as ``"TIMEOUT"``.
        message: the library's message for the failure (``ddpshim_last_error``).
        call: the C function that failed, or ``""``.
    """

    def __init__(self, code: int, message: str, call: str = "") -> None:
        self.code = int(code)
        self.message = message
        self.call = call
        super().__init__(self.__str__())

    @property
    def code_name(self) -> str:
        try:
            return Status(self.code).name
        except ValueError:
            return f"UNKNOWN_{self.code}"

    def __str__(self) -> str:
        where = f"{self.call}: " if self.call else ""
        return f"{where}{self.message or 'no message'} (DDPSHIM_ERR_{self.code_name}, code {self.code})"

    def __reduce__(self):
        return (type(self), (self.code, self.message, self.call))


_c_int64_p = ctypes.POINTER(ctypes.c_int64)
_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_char_buf = ctypes.POINTER(ctypes.c_char)  # a writable char *

PROTOTYPES: Dict[str, Tuple[Any, Tuple[Any, ...]]] = {
    # name: (restype, argtypes), in the header's order.
    "ddpshim_version": (ctypes.c_char_p, ()),
    "ddpshim_last_error": (ctypes.c_char_p, ()),
    "ddpshim_open": (ctypes.c_int, (ctypes.c_char_p, _c_int64_p)),
    "ddpshim_bootstrap_info": (ctypes.c_int, (ctypes.c_int64, _c_char_buf, ctypes.c_size_t)),
    "ddpshim_connect": (ctypes.c_int, (ctypes.c_int64, ctypes.c_char_p)),
    "ddpshim_allreduce": (
        ctypes.c_int,
        (
            ctypes.c_int64,   # comm
            ctypes.c_void_p,  # buf
            ctypes.c_int64,   # count
            ctypes.c_int,     # dtype
            ctypes.c_int,     # op
            ctypes.c_void_p,  # stream
            ctypes.c_uint64,  # step
            ctypes.c_int32,   # bucket
            _c_int64_p,       # work
        ),
    ),
    "ddpshim_broadcast": (
        ctypes.c_int,
        (
            ctypes.c_int64,                    # comm
            ctypes.POINTER(ctypes.c_void_p),   # bufs
            _c_int64_p,                        # counts
            ctypes.c_int,                      # nbufs
            ctypes.c_int,                      # dtype
            ctypes.c_int,                      # root
            ctypes.c_uint64,                   # step
            ctypes.c_int32,                    # bucket
            _c_int64_p,                        # work
        ),
    ),
    "ddpshim_mark": (ctypes.c_int, (ctypes.c_int64, ctypes.c_uint64, ctypes.c_int)),
    "ddpshim_work_wait": (ctypes.c_int, (ctypes.c_int64,)),
    "ddpshim_work_test": (ctypes.c_int, (ctypes.c_int64, _c_int_p)),
    "ddpshim_work_free": (ctypes.c_int, (ctypes.c_int64,)),
    "ddpshim_abort": (ctypes.c_int, (ctypes.c_int64, ctypes.c_char_p)),
    "ddpshim_reformed": (ctypes.c_int, (ctypes.c_int64, ctypes.c_char_p)),
    "ddpshim_close": (ctypes.c_int, (ctypes.c_int64,)),
    "ddpshim_comm_info": (ctypes.c_int, (ctypes.c_int64, _c_char_buf, ctypes.c_size_t)),
    "ddpshim_nccl_info": (ctypes.c_int, (_c_char_buf, ctypes.c_size_t)),
}
"""restype and argtypes of every function of ddpshim.h; the tests compare it with the header."""

# Calls that never block, made through a PyDLL handle to the same library:
# ctypes then keeps the GIL across the call instead of dropping and taking it
# back. On the hook's path the drop is where the waiter thread (woken for an
# earlier bucket) takes the GIL, and the autograd thread then waits for it
# to come back: on 2 busy cores that hand-off cost more than the call.
_QUICK = ("ddpshim_allreduce", "ddpshim_work_free")

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_quick: Optional[ctypes.PyDLL] = None
_lib_path = ""
_loaded_by_pid = 0
_forked_child = False
_loading = False  # a thread is inside dlopen: the Go runtime may be starting


def _after_fork_in_child() -> None:
    global _forked_child, _lock
    if _lib is not None or _loading:
        _forked_child = True
    # The parent's lock may have been held by a thread that does not exist here.
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def library_path() -> str:
    """Returns the path the library is (or would be) loaded from.

    ``$DDP_AGENT_SHIM`` when set, else ``libddpshim.so`` next to this package.
    """
    if _lib is not None:
        return _lib_path
    return os.environ.get(ENV_SHIM) or os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)


def _library() -> ctypes.CDLL:
    """Returns the loaded library, loading it on first use (blocks only for dlopen)."""
    global _lib, _lib_path, _loaded_by_pid, _loading, _quick
    if _forked_child:
        raise ShimError(
            Status.UNAVAILABLE,
            f"{LIBRARY_NAME} was loaded by process {_loaded_by_pid} and this process ({os.getpid()}) "
            "was forked from it; a forked child must not call into the library's Go runtime "
            "(it would hang). Use the communicator only in the process that loaded it.",
        )
    lib = _lib
    if lib is not None:
        return lib
    with _lock:
        if _lib is not None:
            return _lib
        env = os.environ.get(ENV_SHIM)
        bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
        path = env or bundled
        if not os.path.exists(path):
            where = f"${ENV_SHIM}={env!r} (set, so the bundled copy was not tried)" if env else f"${ENV_SHIM} (unset)"
            raise ShimError(
                Status.UNAVAILABLE,
                f"{LIBRARY_NAME} not found: looked at {where} and at {bundled}. "
                f"Build it with `make build` (it lands in bin/ and in python/ddp_agent/), "
                f"or point ${ENV_SHIM} at it.",
            )
        _loading = True
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            _loading = False
            raise ShimError(Status.UNAVAILABLE, f"load {path}: {e}") from e
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError as e:
                raise ShimError(
                    Status.UNAVAILABLE, f"{path} does not export {name}: it is not the library this package binds"
                ) from e
            fn.restype = restype
            fn.argtypes = list(argtypes)
        quick = ctypes.PyDLL(path)  # the same handle: dlopen of a loaded library
        for name in _QUICK:
            restype, argtypes = PROTOTYPES[name]
            fn = getattr(quick, name)
            fn.restype = restype
            fn.argtypes = list(argtypes)
        _lib, _lib_path, _loaded_by_pid, _quick = lib, path, os.getpid(), quick
        return lib


def _check(lib: ctypes.CDLL, rc: int, call: str) -> None:
    """Raises ShimError for a non-zero status.

    Must run on the thread that made the failing call, before any other
    call into the library on that thread: the message is per thread and
    only valid until the next call.
    """
    if rc != Status.OK:
        msg = lib.ddpshim_last_error()
        raise ShimError(rc, msg.decode("utf-8", "replace") if msg else "", call)


def version() -> str:
    """Returns the library's version string, e.g. ``"ddpshim 0.3.0 (abi 1)"``. Loads the library."""
    return _library().ddpshim_version().decode("utf-8", "replace")


def nccl_info() -> Dict[str, Any]:
    """Returns what the library finds of NCCL (``ddpshim_nccl_info``).

    A dict: ``found`` (bool); when found, ``source`` ("process",
    "libnccl.so.2" or the path from ``$DDP_AGENT_NCCL_LIB``), ``version``
    ("2.20.5") and ``features`` (avg, bfloat16, nonblocking, last_error,
    finalize: bools); when not, ``error`` naming every place tried. Loads
    the library, and NCCL if no call has yet (blocks for dlopen); no
    communication.
    """
    lib = _library()
    text = _read_string(lib, lambda _, buf, size: lib.ddpshim_nccl_info(buf, size), 0, "ddpshim_nccl_info")
    return json.loads(text)


def _read_string(lib: ctypes.CDLL, fn: Any, handle: int, call: str, size: int = 4096) -> str:
    """Calls a (handle, buf, len) function, growing buf once if the library says it is too small."""
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        rc = fn(handle, buf, size)
        if rc == Status.OK:
            return buf.value.decode("utf-8", "replace")
        msg = (lib.ddpshim_last_error() or b"").decode("utf-8", "replace")
        m = re.search(r"(\d+)\s+(?:bytes\s+)?needed", msg)  # "buffer of N bytes is too small: M needed"
        if rc != Status.INVALID or not m or not size < int(m.group(1)) <= 64 << 20:
            raise ShimError(rc, msg, call)
        size = int(m.group(1))
    raise ShimError(Status.INTERNAL, f"buffer of {size} bytes still too small", call)


class Work:
    """One all-reduce started by :meth:`Comm.allreduce`.

    The caller owns the handle and must :meth:`free` it once, after which it
    is invalid. Safe to use from any thread; typically one waiter thread
    calls :meth:`wait` and then :meth:`free`.
    """

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def wait(self) -> None:
        """Blocks (GIL released) until the work completes; raises ShimError if it failed.

        With the host transport the calling thread runs the queued
        collectives up to this one itself when none is running.

        Returns within the communicator's timeout_ms even when a peer dies.
        """
        lib = _library()
        _check(lib, lib.ddpshim_work_wait(self.handle), "ddpshim_work_wait")

    def test(self) -> bool:
        """Returns whether the work has completed, without blocking (its status comes from :meth:`wait`)."""
        lib = _library()
        done = ctypes.c_int(0)
        _check(lib, lib.ddpshim_work_test(self.handle, ctypes.byref(done)), "ddpshim_work_test")
        return bool(done.value)

    def free(self) -> None:
        """Releases the handle; a work still running keeps running. Does not block (nor drop the GIL)."""
        lib = _library()
        _check(lib, _quick.ddpshim_work_free(self.handle), "ddpshim_work_free")  # type: ignore[union-attr]

    def __repr__(self) -> str:
        return f"Work({self.handle})"


class Comm:
    """A communicator: one handle of the library's table.

    Every method may be called from any thread. The caller owns the handle
    and must :meth:`close` it exactly once; there is no finalizer.
    """

    __slots__ = ("handle", "queues")

    def __init__(self, handle: int, queues: bool = False) -> None:
        self.handle = handle
        # The host transport's allreduce only queues the work (never blocks),
        # so it is called without dropping the GIL; NCCL's may block.
        self.queues = queues

    @classmethod
    def open(cls, config: Union[Mapping[str, Any], str]) -> "Comm":
        """Opens a communicator from a config (a mapping, or JSON text; keys in ddpshim.h).

        With bootstrap "agent" this blocks until every rank has opened, or
        timeout_ms. With bootstrap "external" it returns at once, and the
        caller finishes with :meth:`bootstrap_info` and :meth:`connect`.
        """
        text = config if isinstance(config, str) else json.dumps(dict(config))
        lib = _library()
        handle = ctypes.c_int64(0)
        _check(lib, lib.ddpshim_open(text.encode("utf-8"), ctypes.byref(handle)), "ddpshim_open")
        transport = (json.loads(text) if isinstance(config, str) else config).get("transport", "host")
        return cls(handle.value, queues=transport == "host")

    def bootstrap_info(self) -> str:
        """Returns this rank's bootstrap blob (one line of text) for an "external" bootstrap. Does not block."""
        lib = _library()
        return _read_string(lib, lib.ddpshim_bootstrap_info, self.handle, "ddpshim_bootstrap_info")

    def connect(self, peers: Union[Sequence[str], str]) -> None:
        """Finishes an "external" bootstrap with every rank's blob, in rank order.

        Blocks until connected to every peer, or timeout_ms.
        """
        text = peers if isinstance(peers, str) else "\n".join(peers)
        lib = _library()
        _check(lib, lib.ddpshim_connect(self.handle, text.encode("utf-8")), "ddpshim_connect")

    def allreduce(
        self,
        ptr: int,
        count: int,
        dtype: int,
        op: int,
        *,
        stream: Optional[int] = None,
        step: int = 0,
        bucket: int = 0,
    ) -> Work:
        """Starts an in-place all-reduce of count elements at address ptr; does not wait for the data.

        Host transport: the memory must stay valid and untouched until the
        returned work completes. NCCL transport: stream is the CUDA stream
        (a ``cudaStream_t`` as an int; None is CUDA's default stream); the
        call blocks until NCCL has enqueued the collective on it (bounded by
        timeout_ms), the returned work is already complete (its wait gives
        the enqueue's status), and the data is ready once the stream gets
        there. Every rank must issue the same collectives in the same order
        with the same count, dtype and op. step and bucket label the timing
        event sent to the agent.
        """
        lib = _library()
        work = ctypes.c_int64(0)
        fn = _quick.ddpshim_allreduce if self.queues else lib.ddpshim_allreduce  # type: ignore[union-attr]
        rc = fn(self.handle, ptr, count, dtype, op, stream, step, bucket, ctypes.byref(work))
        _check(lib, rc, "ddpshim_allreduce")
        return Work(work.value)

    def broadcast(self, ptrs: Sequence[int], counts: Sequence[int], dtype: int, root: int, *, step: int = 0,
                  bucket: int = 0) -> Work:
        """Starts an in-place broadcast from rank root of the buffers at ptrs (counts[i] elements each), as one collective.

        Host transport only (ddpshim_broadcast): every rank ends with root's
        bytes once the returned work completes, and the memory must stay
        valid and untouched until then. It is queued in order with the
        all-reduces; every rank must issue it with the same counts, dtype
        and root.
        """
        if len(ptrs) != len(counts):
            raise ValueError(f"broadcast: {len(ptrs)} buffers and {len(counts)} counts")
        lib = _library()
        n = len(ptrs)
        bufs = (ctypes.c_void_p * n)(*ptrs)
        sizes = (ctypes.c_int64 * n)(*counts)
        work = ctypes.c_int64(0)
        rc = lib.ddpshim_broadcast(self.handle, bufs, sizes, n, dtype, root, step, bucket, ctypes.byref(work))
        _check(lib, rc, "ddpshim_broadcast")
        return Work(work.value)

    def enqueue(
        self,
        ptr: int,
        count: int,
        dtype: int,
        op: int,
        stream: Optional[int],
        step: int = 0,
        bucket: int = 0,
    ) -> None:
        """NCCL transport only: :meth:`allreduce` without a work handle.

        The NCCL transport's work is complete at return, so the hook skips
        the handle and the call that would free it (ddpshim_allreduce with a
        NULL work): one trip into the library per bucket instead of two.
        """
        lib = _library()
        rc = lib.ddpshim_allreduce(self.handle, ptr, count, dtype, op, stream, step, bucket, None)
        if rc:
            _check(lib, rc, "ddpshim_allreduce")

    def mark(self, step: int, kind: Mark = Mark.FORWARD) -> None:
        """Tells ddp-agent that this rank starts the forward pass of step now (ddpshim_mark).

        Never blocks; does nothing without ddp-agent.
        """
        lib = _library()
        rc = lib.ddpshim_mark(self.handle, step, kind)
        if rc:
            _check(lib, rc, "ddpshim_mark")

    def abort(self, reason: Optional[str] = None) -> None:
        """Fails every pending and future collective with ABORTED and unblocks their waiters. Idempotent."""
        lib = _library()
        arg = reason.encode("utf-8") if reason is not None else None
        _check(lib, lib.ddpshim_abort(self.handle, arg), "ddpshim_abort")

    def reformed(self, report: Mapping[str, Any]) -> None:
        """Tells ddp-agent that the job re-formed in process (ddpshim_reformed); nothing without it.

        report: reform, step, resume, source, error, and phases, a list of
        {"name", "ms"}. Raises ShimError (UNAVAILABLE) when the agent's
        connection is lost.
        """
        lib = _library()
        _check(lib, lib.ddpshim_reformed(self.handle, json.dumps(report).encode("utf-8")), "ddpshim_reformed")

    def close(self) -> None:
        """Closes the communicator (aborting pending work) and invalidates the handle.

        Raises ShimError (CLOSED) when called twice.
        """
        lib = _library()
        _check(lib, lib.ddpshim_close(self.handle), "ddpshim_close")

    def info(self) -> Dict[str, Any]:
        """Returns the communicator's description: rank, world_size, transport, counters. Does not block."""
        lib = _library()
        return json.loads(_read_string(lib, lib.ddpshim_comm_info, self.handle, "ddpshim_comm_info"))

    def __repr__(self) -> str:
        return f"Comm({self.handle})"
