"""One rank of the side-by-side all-reduce benchmark: the shim (shared memory and TCP ring), gloo and OpenMPI.

run.py launches it, n ranks at a time, under mpirun (OpenMPI's coll_tuned
algorithm is chosen per launch with --mca) or, without OpenMPI, as plain
processes. Every implementation runs in the same processes, on the same
buffer: for each size (float32, sum, in place) each implementation is first
checked against the exact sum, then the implementations take turns, round by
round, so that drift in machine load hits all alike. A round is
examples/bench/allreduce.py's: warm-up collectives, then as many timed ones as
fit in --target-s; its time is the slowest rank's mean per collective.

Barriers and the shim's bootstrap go through torch.distributed's gloo group
(MASTER_ADDR and MASTER_PORT from the environment), not through MPI, so the
launch without OpenMPI measures the rest the same way. Rank 0 writes every
round's seconds to --json.

Implementations (--impls):
  shm   ddpshim_allreduce + ddpshim_work_wait, shared-memory transport
  tcp   the same over the TCP ring ({"shm": false})
  hierarchical  the same with the default config where the ranks span several
        hosts with more than one on some (examples/bench/links/run.py --per-host)
  gloo  torch.distributed.all_reduce on the gloo group
  mpi   mpi4py's COMM_WORLD.Allreduce(MPI.IN_PLACE, ...)
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # examples/bench: allreduce.py's helpers
import allreduce as base  # noqa: E402  (also imports torch and the shim's binding)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

_shim = base._shim


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--impls", default="shm,tcp,gloo,mpi")
    p.add_argument("--sizes", default="65536,262144,1048576,4194304,16777216,67108864,268435456")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--target-s", type=float, default=0.25)
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--timeout-ms", type=int, default=120000)
    p.add_argument("--json", required=True)
    return p.parse_args()


def rank_and_world():
    """Under mpirun the rank comes from OpenMPI's environment; torch's env:// wants RANK and WORLD_SIZE."""
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def runners(impls, rank, world, timeout_ms):
    """Returns {name: (run(t, step), close())} for the implementations asked for."""
    out = {}
    for name, extra in (("shm", {}), ("tcp", {"shm": False}), ("hierarchical", {})):
        if name not in impls:
            continue
        comm = base.open_comm(rank, world, dict(extra, name="mpi-bench-" + name), timeout_ms)
        info = comm.info()
        got = info.get("transport")
        if got != name:
            raise SystemExit("rank %d: shim comm %r runs transport %r" % (rank, name, got))
        if rank == 0 and name == "shm":
            print("# shim shm: single_copy %s" % info.get("single_copy"), file=sys.stderr, flush=True)
        out[name] = (lambda t, s, c=comm: base.allreduce(c, t, s), comm.close)
    if "gloo" in impls:
        out["gloo"] = (lambda t, s: dist.all_reduce(t), lambda: None)
    if "mpi" in impls:
        from mpi4py import MPI  # MPI_Init: only when asked for

        world_comm = MPI.COMM_WORLD
        if world_comm.Get_size() != world:
            raise SystemExit("MPI world is %d ranks, torch's %d: launch with mpirun" % (world_comm.Get_size(), world))
        # Finalize before os._exit, or mpirun counts the rank as failed.
        out["mpi"] = (lambda t, s: world_comm.Allreduce(MPI.IN_PLACE, [t.numpy(), MPI.FLOAT], op=MPI.SUM),
                      MPI.Finalize)
    return out


def main():
    args = parse_args()
    rank, world = rank_and_world()
    dist.init_process_group("gloo", init_method="env://")
    impls = [s for s in args.impls.split(",") if s]
    run = runners(impls, rank, world, args.timeout_ms)
    sizes = [int(s) for s in args.sizes.split(",")]
    buf = torch.empty(max(sizes) // 4, dtype=torch.float32)
    rows, step, failed = [], 0, False
    for size in sizes:
        t = buf[: size // 4]
        want = base.expected(t.numel(), world)
        ok = {}
        for name in impls:
            base.fill_pattern(t, rank)
            run[name][0](t, step)
            step += 1
            ok[name] = bool(torch.equal(t, want))
        if base.agree_max(0 if all(ok.values()) else 1) > 0:
            failed = True
            print("rank %d: WRONG RESULT at %s: %s" % (rank, base.human(size), ok), file=sys.stderr, flush=True)
        t.zero_()  # timed collectives sum zeros: no overflow however many run
        secs = {name: [] for name in impls}
        for _ in range(args.rounds):
            for name in impls:
                sec, it = base.time_round(lambda s, f=run[name][0]: f(t, s), args, step)
                step += args.warmup + it
                secs[name].append(sec)
        rows.append({"bytes": size, "correct": all(ok.values()), "seconds": secs})
        if rank == 0:
            print("# %d ranks, %s: %s" % (world, base.human(size), ", ".join(
                "%s %.1f us" % (n, 1e6 * sorted(v)[len(v) // 2]) for n, v in secs.items())), file=sys.stderr, flush=True)
    if rank == 0:
        with open(args.json, "w") as f:
            json.dump({"world_size": world, "impls": impls, "rows": rows, "load_end": os.getloadavg()[0]}, f, indent=1)
    dist.barrier()
    for name in impls:
        run[name][1]()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failed else 0)  # no teardown of gloo's threads (allreduce.py says why)


if __name__ == "__main__":
    main()
