"""The ctypes binding against the real libddpshim.so: prototypes, values, every error path, the fork guard.

Two-rank cases run both ranks in this process, one communicator each,
connected from two threads (ddpshim_connect blocks until every peer is there).
"""

import ctypes
import datetime
import mmap
import os
import pathlib
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
import torch
import torch.distributed as dist

import ddp_agent
from ddp_agent import _shim
from ddp_agent._shim import Comm, DType, Mark, Op, ShimError, Status, Work
from ddp_agent import _options
from ddp_agent import hook as hook_mod
from ddp_agent._bootstrap import Communicators

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADER = ROOT / "shim" / "ddpshim.h"

TORCH_DTYPES = {
    DType.INT32: torch.int32,
    DType.INT64: torch.int64,
    DType.FLOAT16: torch.float16,
    DType.FLOAT32: torch.float32,
    DType.FLOAT64: torch.float64,
    DType.BFLOAT16: torch.bfloat16,
}


def header_text() -> str:
    text = HEADER.read_text()
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


# -- the header and the prototypes ---------------------------------------

C_TYPES = {
    "const char *": ctypes.c_char_p,
    "char *": ctypes.POINTER(ctypes.c_char),
    "void *": ctypes.c_void_p,
    "int": ctypes.c_int,
    "int *": ctypes.POINTER(ctypes.c_int),
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "int64_t *": ctypes.POINTER(ctypes.c_int64),
    "const int64_t *": ctypes.POINTER(ctypes.c_int64),
    "void *const *": ctypes.POINTER(ctypes.c_void_p),
    "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
}


def parse_header():
    """Returns {name: (return C type, [parameter C types])} for every function of ddpshim.h."""
    functions = {}
    decl = re.compile(r"^([A-Za-z_][\w \t*]*?)\b(ddpshim_\w+)\s*\(([^)]*)\)\s*;", re.M)
    for m in decl.finditer(header_text()):
        params = [p.strip() for p in m.group(3).split(",")]
        if params == ["void"]:
            params = []
        types = []
        for p in params:
            pm = re.fullmatch(r"(.*?[\s*])(\w+)", p, flags=re.S)
            assert pm, f"cannot parse parameter {p!r} of {m.group(2)}"
            types.append(c_type_name(pm.group(1)))
        functions[m.group(2)] = (c_type_name(m.group(1)), types)
    return functions


def c_type_name(c_type: str) -> str:
    """Normalizes a C type's spelling: "const char*" and "const  char *" -> "const char *"."""
    return re.sub(r"\s*\*", " *", " ".join(c_type.split())).strip()


def test_prototypes_match_the_header():
    functions = parse_header()
    declared = set(re.findall(r"\b(ddpshim_\w+)\s*\(", header_text()))
    assert set(functions) == declared, f"parsed {sorted(functions)}, but {HEADER} declares {sorted(declared)}"
    assert sorted(functions) == sorted(_shim.PROTOTYPES), "functions without prototypes, or prototypes without functions"
    for name, (ret, params) in functions.items():
        unknown = [t for t in [ret, *params] if t not in C_TYPES]
        assert not unknown, f"{name}: C types {unknown} have no ctypes equivalent in this test: add them"
        want_ret = C_TYPES[ret]
        want_args = tuple(C_TYPES[p] for p in params)
        got_ret, got_args = _shim.PROTOTYPES[name]
        assert got_ret is want_ret, f"{name}: restype {got_ret}, header says {ret}"
        assert got_args == want_args, f"{name}: argtypes {got_args}, header says {params}"


def test_loaded_functions_have_their_prototypes():
    lib = _shim._library()
    for name, (restype, argtypes) in _shim.PROTOTYPES.items():
        fn = getattr(lib, name)
        assert fn.restype is restype, name
        assert tuple(fn.argtypes) == argtypes, name


def test_library_exports_only_header_functions():
    nm = subprocess.run(["nm", "-D", "--defined-only", _shim.library_path()], capture_output=True, text=True)
    if nm.returncode != 0:
        pytest.skip(f"nm -D failed: {nm.stderr.strip()}")
    exported = set(re.findall(r"\bT (ddpshim_\w+)$", nm.stdout, flags=re.M))
    declared = set(parse_header())
    assert declared <= exported, f"declared but not exported: {sorted(declared - exported)}"
    # Not part of the ABI: lasterr.c's setter, which cgo needs; it could be hidden.
    internal = {"ddpshim_set_error"}
    assert exported - declared <= internal, f"exported but not in ddpshim.h: {sorted(exported - declared - internal)}"


def test_constants_match_the_header():
    defines = dict(re.findall(r"#define\s+DDPSHIM_(\w+)\s+(\d+)", header_text()))
    abi = defines.pop("ABI_VERSION")
    status = {k[len("ERR_"):] if k.startswith("ERR_") else k: int(v) for k, v in defines.items() if k == "OK" or k.startswith("ERR_")}
    assert status == {s.name: s.value for s in Status}
    dtypes = {k: int(v) for k, v in defines.items() if re.fullmatch(r"(B?FLOAT|INT)\d+", k)}
    assert dtypes == {d.name: d.value for d in DType}
    ops = {k: int(v) for k, v in defines.items() if k in ("SUM", "AVG")}
    assert ops == {o.name: o.value for o in Op}
    marks = {k: int(v) for k, v in defines.items() if k.startswith("MARK_")}
    assert marks == {f"MARK_{m.name}": m.value for m in Mark}
    assert set(defines) == {"OK"} | {f"ERR_{s.name}" for s in Status if s.name != "OK"} | set(dtypes) | set(ops) | set(marks)
    assert re.fullmatch(rf"ddpshim \S+ \(abi {abi}\)", ddp_agent.shim_version()), ddp_agent.shim_version()


def test_version():
    v = ddp_agent.shim_version()
    assert v.startswith("ddpshim ") and v == _shim.version()
    assert ddp_agent.__version__
    assert ddp_agent.shim_path() == os.environ["DDP_AGENT_SHIM"]


def test_missing_library_names_both_places(tmp_path):
    missing = tmp_path / "nope.so"
    code = "import ddp_agent\ntry:\n    ddp_agent.shim_version()\nexcept ddp_agent.ShimError as e:\n    print(e.code_name); print(e)\n"
    env = dict(os.environ, DDP_AGENT_SHIM=str(missing))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("UNAVAILABLE\n"), out.stdout
    assert str(missing) in out.stdout and "DDP_AGENT_SHIM" in out.stdout
    assert os.path.join("ddp_agent", "libddpshim.so") in out.stdout and "make build" in out.stdout


# -- communicators --------------------------------------------------------

def name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def open_world(world_size: int, timeout_ms: int = 10000, **extra):
    """Opens and connects world_size communicators in this process ("external" bootstrap)."""
    n = name()
    comms = [
        Comm.open(dict(rank=r, world_size=world_size, bootstrap="external", timeout_ms=timeout_ms,
                       master_addr="127.0.0.1", name=n, **extra))
        for r in range(world_size)
    ]
    blobs = [c.bootstrap_info() for c in comms]
    run_all([lambda c=c: c.connect(blobs) for c in comms])
    return comms


def run_all(fns, timeout: float = 30):
    """Runs fns on threads of their own; returns their results, re-raising the first exception."""
    results = [None] * len(fns)
    errors = [None] * len(fns)

    def call(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:  # handed to the test thread
            errors[i] = e

    threads = [threading.Thread(target=call, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), f"a call did not return within {timeout}s"
    for e in errors:
        if e is not None:
            raise e
    return results


def close_all(comms):
    for c in comms:
        try:
            c.close()
        except ShimError:
            pass


@pytest.fixture
def comm1():
    comms = open_world(1)
    yield comms[0]
    close_all(comms)


@pytest.fixture
def comm2():
    comms = open_world(2)
    yield comms
    close_all(comms)


def allreduce_tensors(comms, tensors, op, step=0, bucket=0):
    works = [c.allreduce(t.data_ptr(), t.numel(), dtype_of(t), op, step=step, bucket=bucket) for c, t in zip(comms, tensors)]
    try:
        run_all([w.wait for w in works])
    finally:
        for w in works:
            w.free()


def dtype_of(t: torch.Tensor) -> DType:
    return {v: k for k, v in TORCH_DTYPES.items()}[t.dtype]


@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
@pytest.mark.parametrize("op", list(Op), ids=lambda o: o.name)
def test_single_rank_allreduce_is_identity(comm1, dtype, op):
    t = torch.arange(-50, 50).to(TORCH_DTYPES[dtype])
    want = t.clone()
    allreduce_tensors([comm1], [t], op)
    assert torch.equal(t, want)


@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_two_rank_sum_and_avg(comm2, dtype):
    # Small integers and halves: exact in every dtype, bfloat16 included.
    k = torch.arange(-32, 32, dtype=torch.float64)
    td = TORCH_DTYPES[dtype]
    a, b = k.to(td, copy=True), (2 * k).to(td)
    allreduce_tensors(comm2, [a, b], Op.SUM)
    assert torch.equal(a, (3 * k).to(td)) and torch.equal(b, a)

    a, b = k.to(td, copy=True), (2 * k).to(td)
    allreduce_tensors(comm2, [a, b], Op.AVG)
    want = (3 * k) / 2
    if not td.is_floating_point:
        want = torch.trunc(want)  # integers truncate toward zero
    assert torch.equal(a, want.to(td)), (a, want)
    assert torch.equal(b, a)


def test_two_rank_large_odd_count(comm2):
    n = 1_000_003  # not a multiple of anything a ring would like
    g = torch.Generator().manual_seed(0)
    # In anonymous mappings, far above 4 GiB: a pointer truncated to 32 bits would crash or miss.
    maps = [mmap.mmap(-1, 4 * n) for _ in range(2)]
    a, b = (torch.frombuffer(m, dtype=torch.float32) for m in maps)
    a.copy_(torch.randn(n, generator=g))
    b.copy_(torch.randn(n, generator=g))
    want = (a.double() + b.double()) / 2
    assert min(a.data_ptr(), b.data_ptr()) > 2 ** 32
    allreduce_tensors(comm2, [a, b], Op.AVG, step=2 ** 64 - 1, bucket=2 ** 31 - 1)
    assert torch.equal(a, b)
    assert torch.allclose(a.double(), want, rtol=1e-6, atol=1e-7)


def test_count_zero(comm2):
    works = [c.allreduce(0, 0, DType.FLOAT32, Op.SUM) for c in comm2]
    run_all([w.wait for w in works])
    assert all(w.test() for w in works)
    for w in works:
        w.free()


def test_work_test_and_info(comm2):
    t = [torch.ones(1000), torch.ones(1000)]
    works = [c.allreduce(x.data_ptr(), x.numel(), DType.FLOAT32, Op.SUM, step=7, bucket=3) for c, x in zip(comm2, t)]
    run_all([w.wait for w in works])
    assert [w.test() for w in works] == [True, True]
    for w in works:
        w.free()
    info = comm2[1].info()
    assert info["rank"] == 1 and info["world_size"] == 2 and info["collectives"] >= 1, info
    assert info["transport"] in ("tcp", "shm"), info


def test_unfinished_work_tests_false_then_times_out():
    comms = open_world(2, timeout_ms=1000)
    try:
        t = torch.ones(10)
        w = comms[0].allreduce(t.data_ptr(), t.numel(), DType.FLOAT32, Op.SUM)  # rank 1 never joins
        assert w.test() is False
        t0 = time.monotonic()
        with pytest.raises(ShimError) as e:
            w.wait()
        assert e.value.code == Status.TIMEOUT, e.value
        assert time.monotonic() - t0 < 6
        w.free()
    finally:
        close_all(comms)


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_mismatched_counts(shm):
    comms = open_world(2, timeout_ms=5000, shm=shm)
    try:
        a, b = torch.ones(10), torch.ones(11)
        works = [comms[0].allreduce(a.data_ptr(), 10, DType.FLOAT32, Op.SUM),
                 comms[1].allreduce(b.data_ptr(), 11, DType.FLOAT32, Op.SUM)]
        codes = []
        for w in works:
            try:
                w.wait()
                codes.append(Status.OK)
            except ShimError as e:
                codes.append(e.code)
            w.free()
        # Over TCP the rank that notices reports MISMATCH and drops the
        # connection, so its peer may see PEER instead.
        assert Status.MISMATCH in codes and Status.OK not in codes, [Status(c).name for c in codes]
    finally:
        close_all(comms)


def test_abort_unblocks_the_waiter():
    comms = open_world(2, timeout_ms=60000)
    try:
        t = torch.ones(10)
        w = comms[0].allreduce(t.data_ptr(), t.numel(), DType.FLOAT32, Op.SUM)
        threading.Timer(0.2, comms[0].abort, args=("stop for the test",)).start()
        t0 = time.monotonic()
        with pytest.raises(ShimError) as e:
            w.wait()
        assert time.monotonic() - t0 < 10
        assert e.value.code == Status.ABORTED and "stop for the test" in e.value.message, e.value
        w.free()
        comms[0].abort()  # idempotent, reason may be None
        with pytest.raises(ShimError) as e:
            comms[0].allreduce(t.data_ptr(), t.numel(), DType.FLOAT32, Op.SUM)
        assert e.value.code == Status.ABORTED
    finally:
        close_all(comms)


def test_close_with_pending_work():
    comms = open_world(2, timeout_ms=60000)
    t = torch.ones(10)
    w = comms[0].allreduce(t.data_ptr(), t.numel(), DType.FLOAT32, Op.SUM)
    comms[0].close()
    with pytest.raises(ShimError) as e:
        run_all([w.wait], timeout=10)
    assert e.value.code in (Status.CLOSED, Status.ABORTED), e.value
    w.free()
    close_all(comms[1:])


def test_close_right_after_the_last_allreduce_spares_the_peers():
    # Ranks finish the same all-reduce at different moments. A rank that
    # closes as soon as its own copy is complete must not cut off a peer that
    # is still receiving its share (DDP ranks leave training at different
    # times). ddp_agent's Hook.close waits for every rank first anyway; this is
    # the library's own contract, for callers that do not.
    for trial in range(8):
        comms = open_world(3, timeout_ms=10000)
        tensors = [torch.ones(300_000) for _ in comms]

        def rank(i):
            w = comms[i].allreduce(tensors[i].data_ptr(), tensors[i].numel(), DType.FLOAT32, Op.SUM)
            try:
                w.wait()
                return "ok"
            except ShimError as e:
                return str(e)
            finally:
                w.free()
                comms[i].close()

        got = run_all([lambda i=i: rank(i) for i in range(3)])
        assert got == ["ok"] * 3, f"trial {trial}: {got}"
        assert all(torch.equal(t, torch.full_like(t, 3)) for t in tensors)


# -- error paths ----------------------------------------------------------

def expect(code: Status, call: str, fn, *args, **kwargs) -> ShimError:
    with pytest.raises(ShimError) as info:
        fn(*args, **kwargs)
    e = info.value
    assert e.code == code, f"{call}: got {e.code_name} ({e.message}), want {code.name}"
    assert e.code_name == code.name
    assert e.call == call
    assert e.message, f"{call}: empty message"
    assert e.message in str(e) and f"DDPSHIM_ERR_{code.name}" in str(e)
    return e


@pytest.mark.parametrize(
    "config",
    [
        "{",
        "[]",
        '{"world_size": 2}',
        '{"rank": 0}',
        '{"rank": 2, "world_size": 2}',
        '{"rank": -1, "world_size": 2}',
        '{"rank": 0, "world_size": 0}',
        '{"rank": 0, "world_size": 1, "transport": "carrier-pigeon"}',
        '{"rank": 0, "world_size": 1, "bootstrap": "smoke-signals"}',
        '{"rank": 0, "world_size": 1, "timeout_ms": -5}',
        '{"rank": "zero", "world_size": 1}',
    ],
)
def test_open_rejects_bad_config(config):
    expect(Status.INVALID, "ddpshim_open", Comm.open, config)


def test_open_agent_bootstrap_without_agent(tmp_path):
    cfg = dict(rank=0, world_size=1, bootstrap="agent", socket=str(tmp_path / "none.sock"), timeout_ms=2000, name=name())
    t0 = time.monotonic()
    expect(Status.UNAVAILABLE, "ddpshim_open", Comm.open, cfg)
    assert time.monotonic() - t0 < 10


def test_made_up_handles():
    c, w = Comm(987654321), Work(987654321)
    expect(Status.INVALID, "ddpshim_close", c.close)
    expect(Status.INVALID, "ddpshim_abort", c.abort, "x")
    expect(Status.INVALID, "ddpshim_comm_info", c.info)
    expect(Status.INVALID, "ddpshim_bootstrap_info", c.bootstrap_info)
    expect(Status.INVALID, "ddpshim_connect", c.connect, ["x"])
    expect(Status.INVALID, "ddpshim_allreduce", c.allreduce, 0, 0, DType.FLOAT32, Op.SUM)
    expect(Status.INVALID, "ddpshim_work_wait", w.wait)
    expect(Status.INVALID, "ddpshim_work_test", w.test)
    expect(Status.INVALID, "ddpshim_work_free", w.free)
    expect(Status.INVALID, "ddpshim_close", Comm(-1).close)
    expect(Status.INVALID, "ddpshim_close", Comm(0).close)
    expect(Status.INVALID, "ddpshim_close", Comm(2 ** 63 - 1).close)


def test_closed_handle():
    comms = open_world(1)
    c = comms[0]
    c.close()
    e = expect(Status.CLOSED, "ddpshim_close", c.close)  # double close
    expect(Status.CLOSED, "ddpshim_comm_info", c.info)
    expect(Status.CLOSED, "ddpshim_bootstrap_info", c.bootstrap_info)
    expect(Status.CLOSED, "ddpshim_abort", c.abort, None)
    t = torch.ones(4)
    expect(Status.CLOSED, "ddpshim_allreduce", c.allreduce, t.data_ptr(), 4, DType.FLOAT32, Op.SUM)
    expect(Status.CLOSED, "ddpshim_connect", c.connect, ["x"])
    assert e.message


def test_allreduce_bad_arguments(comm1):
    t = torch.ones(4)
    p = t.data_ptr()
    expect(Status.INVALID, "ddpshim_allreduce", comm1.allreduce, p, 4, 99, Op.SUM)  # unknown dtype
    expect(Status.INVALID, "ddpshim_allreduce", comm1.allreduce, p, 4, 0, Op.SUM)  # ncclInt8: not supported
    expect(Status.INVALID, "ddpshim_allreduce", comm1.allreduce, p, 4, DType.FLOAT32, 3)  # unknown op (ncclMin... no)
    expect(Status.INVALID, "ddpshim_allreduce", comm1.allreduce, p, 4, DType.FLOAT32, -1)
    expect(Status.INVALID, "ddpshim_allreduce", comm1.allreduce, p, -1, DType.FLOAT32, Op.SUM)  # negative count
    expect(Status.INVALID, "ddpshim_allreduce", comm1.allreduce, 0, 4, DType.FLOAT32, Op.SUM)  # NULL buf
    lib = _shim._library()
    expect(Status.INVALID, "raw", lambda: _shim._check(lib, lib.ddpshim_allreduce(comm1.handle, p, 4, DType.FLOAT32, Op.SUM, None, 0, 0, None), "raw"))


def test_allreduce_before_connect():
    c = Comm.open(dict(rank=0, world_size=2, bootstrap="external", timeout_ms=1000, name=name()))
    try:
        t = torch.ones(4)
        expect(Status.INVALID, "ddpshim_allreduce", c.allreduce, t.data_ptr(), 4, DType.FLOAT32, Op.SUM)
    finally:
        c.close()


def test_connect_bad_peers():
    c = Comm.open(dict(rank=0, world_size=2, bootstrap="external", timeout_ms=1000, name=name()))
    try:
        blob = c.bootstrap_info()
        assert blob and "\n" not in blob and blob.isprintable()
        expect(Status.INVALID, "ddpshim_connect", c.connect, [blob])  # one blob for two ranks
        expect(Status.INVALID, "ddpshim_connect", c.connect, [blob, blob, blob])
        expect(Status.INVALID, "ddpshim_connect", c.connect, [blob, "not a blob"])
        expect(Status.INVALID, "ddpshim_connect", c.connect, "")
    finally:
        c.close()
    c = Comm.open(dict(rank=0, world_size=1, bootstrap="external", timeout_ms=1000, name=name()))
    try:
        blob = c.bootstrap_info()
        c.connect([blob])
        expect(Status.INVALID, "ddpshim_connect", c.connect, [blob])  # already connected
    finally:
        c.close()


def test_mark():
    # Without ddp-agent a mark does nothing, before or after connecting; an
    # unknown kind and a closed handle are errors, as for any call.
    c = Comm.open(dict(rank=0, world_size=1, bootstrap="external", timeout_ms=1000, name=name()))
    c.mark(0)
    c.connect([c.bootstrap_info()])
    c.mark(1, Mark.FORWARD)
    expect(Status.INVALID, "ddpshim_mark", c.mark, 1, 7)
    c.close()
    expect(Status.CLOSED, "ddpshim_mark", c.mark, 2)


def test_null_pointers():
    lib = _shim._library()
    h = ctypes.c_int64(0)

    def raw(call, rc):
        _shim._check(lib, rc, call)

    expect(Status.INVALID, "open", raw, "open", lib.ddpshim_open(None, ctypes.byref(h)))
    expect(Status.INVALID, "open", raw, "open", lib.ddpshim_open(b'{"rank": 0, "world_size": 1}', None))
    comms = open_world(1)
    try:
        c = comms[0].handle
        expect(Status.INVALID, "info", raw, "info", lib.ddpshim_comm_info(c, None, 100))
        expect(Status.INVALID, "boot", raw, "boot", lib.ddpshim_bootstrap_info(c, None, 100))
        expect(Status.INVALID, "connect", raw, "connect", lib.ddpshim_connect(c, None))
        t = torch.ones(1)
        w = comms[0].allreduce(t.data_ptr(), 1, DType.FLOAT32, Op.SUM)
        w.wait()
        expect(Status.INVALID, "test", raw, "test", lib.ddpshim_work_test(w.handle, None))
        w.free()
        expect(Status.INVALID, "ddpshim_work_free", w.free)  # freed twice
    finally:
        close_all(comms)


def test_small_buffer_grows(comm1):
    lib = _shim._library()
    buf = ctypes.create_string_buffer(4)
    expect(Status.INVALID, "info", lambda: _shim._check(lib, lib.ddpshim_comm_info(comm1.handle, buf, 4), "info"))
    text = _shim._read_string(lib, lib.ddpshim_comm_info, comm1.handle, "ddpshim_comm_info", size=4)
    assert text.startswith("{") and text.endswith("}")


def test_last_error_is_per_thread():
    bad = {"json": "{", "rank": '{"rank": 7, "world_size": 2}'}
    first = {}
    for kind, cfg in bad.items():
        with pytest.raises(ShimError) as e:
            Comm.open(cfg)
        first[kind] = e.value.message
    assert first["json"] != first["rank"]

    def hammer(kind):
        for _ in range(300):
            try:
                Comm.open(bad[kind])
            except ShimError as e:
                assert e.message == first[kind], (kind, e.message)

    run_all([lambda: hammer("json"), lambda: hammer("rank")] * 2)


def test_shim_error_is_picklable():
    import pickle

    e = ShimError(Status.TIMEOUT, "slow peer", "ddpshim_work_wait")
    f = pickle.loads(pickle.dumps(e))
    assert (f.code, f.message, f.call, str(f)) == (e.code, e.message, e.call, str(e))
    assert ShimError(42, "odd").code_name == "UNKNOWN_42"


# -- the fork guard -------------------------------------------------------

def test_forked_child_gets_shim_error_instead_of_hanging():
    _shim.version()  # loaded in this process, so its Go runtime is running
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report and leave without running any of pytest's exit code
        try:
            out = []
            for fn in (ddp_agent.shim_version, lambda: Comm.open('{"rank": 0, "world_size": 1}'),
                       lambda: Work(1).wait(), lambda: Comm(1).close()):
                try:
                    fn()
                    out.append("no error")
                except ShimError as e:
                    out.append(f"{e.code_name} {'forked' in e.message}")
            os.write(w, ("|".join(out) + "\n").encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 30)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("forked child hung calling the shim")
        got = os.read(r, 4096).decode().strip()
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    assert got == "|".join(["UNAVAILABLE True"] * 4), got
    assert os.waitstatus_to_exitcode(status) == 0
    assert _shim.version()  # the parent is unaffected


# -- register() arguments ---------------------------------------------------

def test_register_rejects_unknown_compression_and_transports():
    with pytest.raises(ValueError, match="compression.*not supported.*'fp16' or 'bf16'"):
        ddp_agent.register(object(), compression="zstd")
    with pytest.raises(ValueError, match="transport.*auto, host, nccl"):
        ddp_agent.register(object(), transport="carrier-pigeon")
    for transport in ("auto", "host", "nccl"):
        for compression in (None, "fp16", "bf16"):
            with pytest.raises(TypeError, match="DistributedDataParallel"):
                ddp_agent.register(object(), transport=transport, compression=compression)
    with pytest.raises(ValueError, match="transport"):
        ddp_agent.info("carrier-pigeon")


def test_nccl_info_is_json_with_found():
    got = ddp_agent.nccl_info()
    assert isinstance(got["found"], bool), got
    if got["found"]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", got["version"]) and got["source"], got
        assert set(got["features"]) >= {"avg", "bfloat16", "nonblocking"}, got
    else:
        assert got["error"], got


def test_timeouts(monkeypatch):
    monkeypatch.delenv(_options.ENV_TIMEOUT, raising=False)
    assert _options.timeout_ms(None) == 600_000
    assert _options.timeout_ms(5) == 5000
    assert _options.timeout_ms(0.25) == 250
    assert _options.timeout_ms(datetime.timedelta(minutes=2)) == 120_000
    monkeypatch.setenv(_options.ENV_TIMEOUT, "42.5")
    assert _options.timeout_ms(None) == 42_500
    assert _options.timeout_ms(3) == 3000  # the argument wins
    monkeypatch.setenv(_options.ENV_TIMEOUT, "soon")
    with pytest.raises(ValueError, match=_options.ENV_TIMEOUT):
        _options.timeout_ms(None)
    for bad in (0, -1, float("inf"), float("nan"), datetime.timedelta(0)):
        with pytest.raises(ValueError):
            _options.timeout_ms(bad)
    with pytest.raises(TypeError):
        _options.timeout_ms("10")


def test_timeout_follows_the_process_group(monkeypatch):
    """Without timeout= or the variable, the hook waits as long as DDP's own all-reduce: the group's timeout."""
    monkeypatch.delenv(_options.ENV_TIMEOUT, raising=False)
    assert _options.timeout_ms(None, 123.0) == 123_000
    assert _options.timeout_ms(None, 365 * 86400.0) == 30 * 86400_000  # as long as the shim takes
    with pytest.raises(ValueError, match="at most 30 days"):
        _options.timeout_ms(datetime.timedelta(days=31))
    assert _options.timeout_ms(5, 123.0) == 5000  # the argument wins
    monkeypatch.setenv(_options.ENV_TIMEOUT, "42.5")
    assert _options.timeout_ms(None, 123.0) == 42_500  # and the variable
    monkeypatch.delenv(_options.ENV_TIMEOUT)
    assert _options.group_timeout(object()) is None  # nothing torch tells: 600 s
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=123))
    try:
        assert _options.group_timeout(dist.distributed_c10d._get_default_group()) == 123.0
        sub = dist.new_group([0], timeout=datetime.timedelta(seconds=77))
        assert _options.group_timeout(sub) == 77.0
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        hook = ddp_agent.register(model)
        try:
            assert hook.timeout_ms == 123_000
        finally:
            hook.close()
    finally:
        dist.destroy_process_group()


def test_register_twice():
    """A second hook on one model: ddp_agent's words, and no name taken (the ranks' names stay in step)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        first = ddp_agent.register(model)
        with pytest.raises(RuntimeError, match="has a comm hook already.*DDPAgentStrategy"):
            ddp_agent.register(model)
        other = ddp_agent.register(torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2)))
        assert int(other.name.split("-")[1]) == int(first.name.split("-")[1]) + 1, (first.name, other.name)
        first.close()
        other.close()
    finally:
        dist.destroy_process_group()


def test_launch_option(monkeypatch):
    monkeypatch.delenv(_options.ENV_LAUNCH, raising=False)
    assert _options.launch(None) == "inline"
    assert _options.launch("thread") == "thread"
    monkeypatch.setenv(_options.ENV_LAUNCH, "thread")
    assert _options.launch(None) == "thread"
    assert _options.launch("inline") == "inline"  # the argument wins
    monkeypatch.setenv(_options.ENV_LAUNCH, "later")
    with pytest.raises(ValueError, match=_options.ENV_LAUNCH):
        _options.launch(None)
    with pytest.raises(ValueError, match="launch='async'"):
        _options.launch("async")


def test_extra_config_from_the_environment(monkeypatch):
    monkeypatch.delenv("DDP_AGENT_SOCKET", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    h = Communicators("ddp_agent-7", rank=1, world_size=2, timeout_ms=5000)  # just the config: no process group needed
    monkeypatch.setenv(hook_mod.ENV_SHIM_CONFIG, '{"shm": false, "log_level": "debug"}')
    cfg = h.config()
    assert cfg == {"rank": 1, "world_size": 2, "transport": "host", "timeout_ms": 5000, "name": "ddp_agent-7",
                   "master_addr": "127.0.0.1", "bootstrap": "external", "shm": False, "log_level": "debug"}
    c = Comm.open(dict(cfg, rank=0, world_size=1))  # the shim takes it
    c.close()
    for bad in ("{", "[1]", '{"rank": 0}', '{"name": "x"}'):
        monkeypatch.setenv(hook_mod.ENV_SHIM_CONFIG, bad)
        with pytest.raises(ValueError, match=hook_mod.ENV_SHIM_CONFIG):
            h.config()
    monkeypatch.delenv(hook_mod.ENV_SHIM_CONFIG)
    monkeypatch.setenv("DDP_AGENT_SOCKET", "/run/x/control.sock")
    monkeypatch.setenv("DDP_AGENT_GENERATION", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    cfg = h.config()
    assert (cfg["bootstrap"], cfg["socket"], cfg["generation"], cfg["local_rank"], cfg["global_rank"]) == (
        "agent", "/run/x/control.sock", 3, 1, 1)
    monkeypatch.setenv("WORLD_SIZE", "4")  # a subgroup of the job: through torch's store
    assert h.config()["bootstrap"] == "external"


def test_nccl_config(monkeypatch):
    monkeypatch.delenv("DDP_AGENT_SOCKET", raising=False)
    monkeypatch.delenv(hook_mod.ENV_SHIM_CONFIG, raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    h = Communicators("ddp_agent-3", rank=0, world_size=2, timeout_ms=5000)
    monkeypatch.delenv(_shim.ENV_NCCL_LIB, raising=False)
    # A communicator of its own, beside the host one.
    assert h.config("nccl") == {"rank": 0, "world_size": 2, "transport": "nccl", "timeout_ms": 5000,
                                 "name": "ddp_agent-3-nccl", "bootstrap": "external"}
    # The library's Go runtime does not see variables set after the process
    # started: the hook passes $DDP_AGENT_NCCL_LIB on itself.
    monkeypatch.setenv(_shim.ENV_NCCL_LIB, "/opt/nccl/libnccl.so.2")
    assert h.config("nccl")["nccl_lib"] == "/opt/nccl/libnccl.so.2"
    assert "nccl_lib" not in h.config("host")
    monkeypatch.setenv(hook_mod.ENV_SHIM_CONFIG, '{"nccl_lib": "/elsewhere/libnccl.so.2"}')
    assert h.config("nccl")["nccl_lib"] == "/elsewhere/libnccl.so.2"
