/*
 * ddpshim.h: the C ABI of libddpshim.so, the data plane of ddp-agent.
 *
 * The library all-reduces DDP gradient buckets. Every function returns
 * DDPSHIM_OK (0) or one of the DDPSHIM_ERR_* codes; after a failure,
 * ddpshim_last_error() on the same thread describes it. Handles are
 * positive integers from a locked table: a stale, closed or made-up handle
 * gives DDPSHIM_ERR_INVALID or DDPSHIM_ERR_CLOSED, never a crash.
 *
 * Threads: every function may be called from any thread. The library
 * embeds a Go runtime: a process must load no other Go shared library, and
 * a child forked after loading must not call into it (the Python package
 * enforces this with os.register_at_fork).
 *
 * dtype and op values are those of ncclDataType_t and ncclRedOp_t, so the
 * NCCL transport passes them through unchanged.
 */
#ifndef DDPSHIM_H
#define DDPSHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DDPSHIM_ABI_VERSION 1

/* Status codes. */
#define DDPSHIM_OK 0
#define DDPSHIM_ERR_INVALID 1     /* bad argument: null pointer, unknown dtype or op, bad config, unknown handle */
#define DDPSHIM_ERR_CLOSED 2      /* the handle was closed (or freed) */
#define DDPSHIM_ERR_ABORTED 3     /* the communicator was aborted (ddpshim_abort, the agent, or an earlier failure) */
#define DDPSHIM_ERR_TIMEOUT 4     /* a collective or the bootstrap did not finish within timeout_ms */
#define DDPSHIM_ERR_PEER 5        /* a peer went away or broke the protocol */
#define DDPSHIM_ERR_MISMATCH 6    /* ranks disagree on count, dtype or op */
#define DDPSHIM_ERR_UNAVAILABLE 7 /* the transport or the agent cannot be reached here */
#define DDPSHIM_ERR_INTERNAL 8    /* a bug: the message says where */

/* Data types (ncclDataType_t values). */
#define DDPSHIM_INT32 2
#define DDPSHIM_INT64 4
#define DDPSHIM_FLOAT16 6
#define DDPSHIM_FLOAT32 7
#define DDPSHIM_FLOAT64 8
#define DDPSHIM_BFLOAT16 9

/* Reduction ops (ncclRedOp_t values). AVG divides the sum by the world
 * size once, on the rank that owns each chunk; integers truncate. */
#define DDPSHIM_SUM 0
#define DDPSHIM_AVG 4

/* ddpshim_version returns a static string such as "ddpshim 0.3.0 (abi 1)".
 * It never fails. */
const char *ddpshim_version(void);

/* ddpshim_last_error returns the message of the last failed call on the
 * calling thread, or "" when there was none. The string stays valid until
 * the next ddpshim call on that thread. */
const char *ddpshim_last_error(void);

/* ddpshim_open creates a communicator and stores its handle in *comm.
 * config is a JSON object:
 *   rank, world_size       (required) this rank and the number of ranks
 *   transport              "host" (default; CPU memory; "auto" means "host"), or
 *                          "nccl": NCCL, found at run time: the NCCL already
 *                          in the process, else libnccl.so.2, else nccl_lib.
 *                          The communicator takes the calling thread's CUDA
 *                          device. Bootstrap "agent": rank 0's NCCL unique id
 *                          goes through the agent's store; "external": rank
 *                          0's blob carries it
 *   nccl_lib               path of an NCCL library (default
 *                          $DDP_AGENT_NCCL_LIB)
 *   cuda_lib               path of a CUDA driver, tried after the process's
 *                          symbols and libcuda.so.1 (default
 *                          $DDP_AGENT_CUDA_LIB); without one the nccl
 *                          transport has no GPU-side timing or hang watch
 *   bootstrap              "agent": exchange addresses through the ddp-agent
 *                          control socket at "socket" (blocks until every
 *                          rank has opened, or timeout_ms); "external": the
 *                          caller exchanges ddpshim_bootstrap_info blobs and
 *                          calls ddpshim_connect (default: "agent" when
 *                          "socket" is set, else "external")
 *   socket, generation, local_rank, global_rank
 *                          the agent's control socket (DDP_AGENT_SOCKET),
 *                          DDP_AGENT_GENERATION, LOCAL_RANK and RANK (the
 *                          agent admits workers by global rank; default: rank)
 *   sidecar, sidecar_job   under bootstrap "external": the node's sidecar
 *                          (ddp-agent sidecar) socket, and the job as the
 *                          sidecar sees it (an object of strings: job,
 *                          world_size, local_world_size, group_rank,
 *                          master_addr, relay, gpu, stack_dir). The
 *                          communicator sends it its events and obeys its
 *                          Abort; no sidecar, or a lost one, changes nothing
 *                          else (the link redials in the background). ddpshim_comm_info says "sidecar" (connected)
 *                          and "sidecar_relay" (the leading sidecar's relay)
 *   first_step, first_bucket
 *                          the collective the communicator is opened for (a
 *                          comm hook's first bucket): while the bootstrap
 *                          waits for the other ranks, the agent or sidecar
 *                          is told, after a second, that this rank has
 *                          arrived at it, so a rank that never comes is a
 *                          hang as at any later collective (default: none)
 *   timeout_ms             bound on the bootstrap and on each collective (default 600000,
 *                          at most 30 days)
 *   host                   address peers use to reach this rank (default: the
 *                          address that routes to "master_addr", else 127.0.0.1)
 *   master_addr            see host
 *   shm                    false disables shared memory between ranks on one host
 *   name                   distinguishes communicators opened in the same job
 *   log_level              the shim's own log on stderr: debug, info, warn (default), error
 *   note_file              where the process's communicators note, as JSON,
 *                          when one first closed and, when a first failed
 *                          collective was a peer's doing (it closed, aborted,
 *                          or its connection broke), the peer, how and when:
 *                          the agent names the rank that failed first from it
 *                          (default $DDP_AGENT_COMM_NOTE_FILE)
 * Returns DDPSHIM_OK, DDPSHIM_ERR_INVALID (null pointer, bad JSON, bad
 * rank/world_size), DDPSHIM_ERR_UNAVAILABLE (no agent, no port, no NCCL),
 * DDPSHIM_ERR_TIMEOUT, DDPSHIM_ERR_PEER. */
int ddpshim_open(const char *config, int64_t *comm);

/* ddpshim_bootstrap_info writes this rank's NUL-terminated bootstrap blob
 * (one line of printable text) into buf. Only for bootstrap "external".
 * Returns DDPSHIM_OK, DDPSHIM_ERR_INVALID (null buf, buf too small: the
 * message gives the size needed, unknown handle, already connected),
 * DDPSHIM_ERR_CLOSED. */
int ddpshim_bootstrap_info(int64_t comm, char *buf, size_t len);

/* ddpshim_connect finishes an "external" bootstrap: peers holds the blobs of
 * all ranks, in rank order, separated by '\n'. It blocks until connected to
 * every peer or timeout_ms. Returns DDPSHIM_OK, DDPSHIM_ERR_INVALID (null
 * peers, wrong number of blobs, malformed blob, already connected),
 * DDPSHIM_ERR_CLOSED, DDPSHIM_ERR_TIMEOUT, DDPSHIM_ERR_PEER. */
int ddpshim_connect(int64_t comm, const char *peers);

/* ddpshim_allreduce starts an in-place all-reduce of count elements at buf
 * and stores a work handle in *work; it does not wait for the data. buf
 * must stay valid and untouched until the work completes. Every rank must
 * issue the same collectives in the same order with the same count, dtype
 * and op. stream is the CUDA stream for the nccl transport (NULL for host).
 * With the nccl transport the call returns once the collective is enqueued
 * on stream (NCCL's non-blocking enqueue is polled to completion, bounded by
 * timeout_ms) and the work is already complete: the stream orders the rest.
 * An NCCL failure fails this call with NCCL's message (and its
 * ncclGetLastError text) and aborts the communicator; avg and bfloat16 need
 * NCCL 2.10 (DDPSHIM_ERR_INVALID before). With a CUDA driver, CUDA events
 * recorded before and after the collective on stream let a watchdog thread
 * time it and see it finish: one not finished timeout_ms after its enqueue,
 * or an asynchronous NCCL error, aborts the communicator, and the next call
 * fails with DDPSHIM_ERR_ABORTED naming the cause (step and bucket).
 * step and bucket label the timing event sent to the agent. count may be 0.
 * work may be NULL with the nccl transport, whose work is complete at
 * return: no handle is made and none needs freeing (the cheaper call, one
 * fewer trip into the library per bucket).
 * Returns DDPSHIM_OK, DDPSHIM_ERR_INVALID (null buf with count > 0, null
 * work with the host transport, negative count, unknown dtype or op, unknown handle, not
 * connected), DDPSHIM_ERR_CLOSED, DDPSHIM_ERR_ABORTED (aborted, or an
 * earlier collective failed). */
int ddpshim_allreduce(int64_t comm, void *buf, int64_t count, int dtype, int op,
                      void *stream, uint64_t step, int32_t bucket, int64_t *work);

/* ddpshim_broadcast starts an in-place broadcast from rank root of nbufs
 * buffers, counts[i] elements at bufs[i], as one collective, and stores a
 * work handle in *work: every rank ends with root's bytes. The buffers are
 * one run of bytes, in order: every rank passes the same counts (only
 * their total is checked). It is queued in order with the all-reduces and
 * has their rules (the buffers untouched until the work completes, every
 * rank the same dtype and root, each collective bounded by timeout_ms,
 * errors through ddpshim_work_wait); dtype only sizes the elements. Over
 * shared memory each rank reads root's buffers once, straight from root's
 * memory (single copy, from 64 KiB in all, as the all-reduce's), while
 * root writes a world-th of them into every other rank (from 64 KiB a
 * rank), two cores copying at once; over TCP
 * the bytes go along the ring from root, pipelined; in a hierarchy through
 * root's host, its leader and the other hosts' leaders. One collective for
 * many buffers pays one round of the ranks' synchronisation, where a
 * collective each paid one apiece. Host transport only: on GPU memory,
 * torch.distributed's broadcast is NCCL's own. step and bucket label its
 * timing event, as for an all-reduce. nbufs may be 0 (bufs and counts may
 * then be NULL): the ranks only meet.
 * Returns DDPSHIM_OK, DDPSHIM_ERR_INVALID (null work, null bufs or counts
 * with nbufs > 0, nbufs negative or above 2^20, a null buffer with a count
 * > 0, a negative count, unknown dtype, root not a rank, the nccl
 * transport, unknown handle, not connected), DDPSHIM_ERR_CLOSED,
 * DDPSHIM_ERR_ABORTED. */
int ddpshim_broadcast(int64_t comm, void *const *bufs, const int64_t *counts, int nbufs, int dtype, int root,
                      uint64_t step, int32_t bucket, int64_t *work);

/* ddpshim_mark tells ddp-agent that this rank started the forward pass of
 * step (the step number its buckets of that iteration will carry) now;
 * kind is DDPSHIM_MARK_FORWARD. The agent splits a persistent straggler's
 * lateness into input (before forward), compute and communication with it.
 * It never blocks (a slow agent drops marks, counted with the events) and
 * does nothing without ddp-agent. Returns DDPSHIM_OK, DDPSHIM_ERR_INVALID
 * (unknown handle or kind), DDPSHIM_ERR_CLOSED. */
#define DDPSHIM_MARK_FORWARD 0
int ddpshim_mark(int64_t comm, uint64_t step, int kind);

/* ddpshim_work_wait blocks until the work completes and returns its status:
 * DDPSHIM_OK; DDPSHIM_ERR_TIMEOUT, DDPSHIM_ERR_PEER or DDPSHIM_ERR_MISMATCH
 * for the collective that failed first; DDPSHIM_ERR_ABORTED for every later
 * one and after ddpshim_abort; DDPSHIM_ERR_CLOSED when the communicator was
 * closed before it ran; DDPSHIM_ERR_INVALID (unknown handle). Collectives
 * run one at a time in issue order, each bounded by timeout_ms from its
 * start, so a wait returns even when a peer dies or hangs. When none is
 * running, the calling thread runs the queued ones up to this work itself
 * (host transport), saving two thread wake-ups per collective. The handle
 * stays valid until ddpshim_work_free. */
int ddpshim_work_wait(int64_t work);

/* ddpshim_work_test stores 1 in *done when the work has completed, else 0,
 * without blocking. Returns DDPSHIM_OK (the work's own status comes from
 * ddpshim_work_wait) or DDPSHIM_ERR_INVALID (null done, unknown handle). */
int ddpshim_work_test(int64_t work, int *done);

/* ddpshim_work_free releases a work handle; a work still running keeps
 * running. Returns DDPSHIM_OK or DDPSHIM_ERR_INVALID (unknown handle). */
int ddpshim_work_free(int64_t work);

/* ddpshim_abort fails every pending and future collective of comm with
 * DDPSHIM_ERR_ABORTED and unblocks their waiters; reason (may be NULL) goes
 * into their messages. Idempotent. Returns DDPSHIM_OK, DDPSHIM_ERR_INVALID
 * (unknown handle), DDPSHIM_ERR_CLOSED. */
int ddpshim_abort(int64_t comm, const char *reason);

/* ddpshim_reformed tells ddp-agent (or the sidecar) that watches comm's
 * rank that the job re-formed in process (ddp_agent.InProcess) rather than
 * restarting: report is a JSON object with reform (its number in the
 * attempt, from 1), step (the step that failed), resume (the step every
 * rank resumed at), source (the rank whose state the others took), error
 * (the fault's first line) and phases (an array of {"name", "ms"}, in
 * order). It never blocks for long (a slow agent: about 100 ms) and does
 * nothing without ddp-agent. Returns DDPSHIM_OK, DDPSHIM_ERR_INVALID
 * (unknown handle, null or malformed report), DDPSHIM_ERR_CLOSED,
 * DDPSHIM_ERR_UNAVAILABLE (the agent's connection is lost). */
int ddpshim_reformed(int64_t comm, const char *report);

/* ddpshim_close aborts comm if work is pending, releases its sockets,
 * shared memory and agent connection, and invalidates the handle. Work
 * handles of comm stay valid (their waits return DDPSHIM_ERR_CLOSED or their
 * final status) until freed. Returns DDPSHIM_OK, DDPSHIM_ERR_INVALID
 * (unknown handle), DDPSHIM_ERR_CLOSED (closed twice). */
int ddpshim_close(int64_t comm);

/* ddpshim_nccl_info writes a NUL-terminated JSON object about the NCCL the
 * nccl transport would use (resolved as in ddpshim_open, with
 * $DDP_AGENT_NCCL_LIB): found, and then source ("process", "libnccl.so.2" or
 * the path), version ("2.20.5"), features (avg, bfloat16, nonblocking,
 * last_error, finalize); or found false and error, naming every place tried.
 * Also "cuda": the CUDA driver the watchdog times collectives with (process
 * symbols, libcuda.so.1, then $DDP_AGENT_CUDA_LIB): found, source, driver
 * ("12.8"), or found false and error.
 * Returns DDPSHIM_OK or DDPSHIM_ERR_INVALID (null buf, too small). */
int ddpshim_nccl_info(char *buf, size_t len);

/* ddpshim_comm_info writes a NUL-terminated JSON object describing comm
 * into buf: rank, world_size, transport ("tcp", "shm", "hierarchical":
 * shared memory within hosts and a ring of one rank per host between them,
 * or "nccl", with an
 * "nccl" object: source, version, nonblocking, cuda: whether the
 * watchdog has a CUDA driver), collectives (completed), run_by_waiter (of
 * those, how many a ddpshim_work_wait ran on its own thread rather than the
 * communicator's executor), single_copy (with "shm": whether all-reduces of
 * 64 KiB and more copy straight between the ranks' buffers with
 * process_vm_readv, which needs ptrace access between them),
 * events_sent, events_dropped, agent (whether connected). Returns
 * DDPSHIM_OK, DDPSHIM_ERR_INVALID (null buf, too small, unknown handle),
 * DDPSHIM_ERR_CLOSED. */
int ddpshim_comm_info(int64_t comm, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* DDPSHIM_H */
