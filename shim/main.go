// Command shim is libddpshim.so, the data plane of ddp-agent: a C ABI
// (ddpshim.h) that all-reduces DDP gradient buckets, built with
// go build -buildmode=c-shared. This package is glue only: the exported
// functions, the handle table, and the status codes and last-error
// message crossing into C. The communicator is shim/comm; the
// transports are shim/host and shim/nccl.
package main

// #include <stdint.h>
// #include <stdlib.h>
// #include "lasterr.h"
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/comm"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
	"github.com/ddp-agent/ddp-agent/shim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

func main() {}

// lib is the process-wide handle table. A C ABI has no constructor to hang
// it on: every exported function reaches the same table.
var lib = newTable()

//export ddpshim_open
func ddpshim_open(config *C.char, handle *C.int64_t) (rc C.int) {
	defer guard("ddpshim_open", &rc)
	if config == nil || handle == nil {
		return fail(status.Errorf(status.Invalid, "ddpshim_open: config and comm must not be NULL"))
	}
	cfg, err := comm.ParseConfig(C.GoString(config))
	if err != nil {
		return fail(err)
	}
	c, err := comm.Open(cfg)
	if err != nil {
		return fail(fmt.Errorf("ddpshim_open (rank %d of %d): %w", *cfg.Rank, *cfg.WorldSize, err))
	}
	*handle = C.int64_t(lib.addComm(c))
	return status.OK
}

//export ddpshim_bootstrap_info
func ddpshim_bootstrap_info(comm C.int64_t, buf *C.char, n C.size_t) (rc C.int) {
	defer guard("ddpshim_bootstrap_info", &rc)
	c, err := lib.comm(int64(comm))
	if err != nil {
		return fail(err)
	}
	s, err := c.Info()
	if err != nil {
		return fail(err)
	}
	return result(copyOut(buf, n, s))
}

//export ddpshim_connect
func ddpshim_connect(comm C.int64_t, peers *C.char) (rc C.int) {
	defer guard("ddpshim_connect", &rc)
	c, err := lib.comm(int64(comm))
	if err != nil {
		return fail(err)
	}
	if peers == nil {
		return fail(status.Errorf(status.Invalid, "ddpshim_connect: peers must not be NULL"))
	}
	lines := strings.Split(strings.TrimRight(C.GoString(peers), "\n"), "\n")
	if err := c.Connect(lines); err != nil {
		return fail(fmt.Errorf("ddpshim_connect (rank %d of %d): %w", c.Rank(), c.Size(), err))
	}
	return status.OK
}

//export ddpshim_allreduce
func ddpshim_allreduce(comm C.int64_t, buf unsafe.Pointer, count C.int64_t, dtype C.int, op C.int,
	stream unsafe.Pointer, step C.uint64_t, bucket C.int32_t, work *C.int64_t) (rc C.int) {
	defer guard("ddpshim_allreduce", &rc)
	c, err := lib.comm(int64(comm))
	if err != nil {
		return fail(err)
	}
	// The nccl transport's work is complete at return, so a caller may skip
	// the handle (and the call that frees it); the host transport's is not.
	if work == nil && c.Transport() != "nccl" {
		return fail(status.Errorf(status.Invalid, "ddpshim_allreduce: work must not be NULL with transport %q", c.Transport()))
	}
	if stream != nil && c.Transport() != "nccl" {
		return fail(status.Errorf(status.Invalid, "ddpshim_allreduce: a CUDA stream was given, but transport %q works on host memory", c.Transport()))
	}
	if dtype < 0 || dtype > 255 || op < 0 || op > 255 {
		return fail(status.Errorf(status.Invalid, "ddpshim_allreduce: unknown dtype %d or op %d", dtype, op))
	}
	w, err := c.AllReduce(buf, int64(count), reduce.DType(dtype), reduce.Op(op), stream, uint64(step), int32(bucket))
	if err != nil {
		return fail(fmt.Errorf("ddpshim_allreduce: %w", err))
	}
	if work != nil {
		*work = C.int64_t(lib.addWork(w))
	}
	return status.OK
}

//export ddpshim_broadcast
func ddpshim_broadcast(comm C.int64_t, bufs *unsafe.Pointer, counts *C.int64_t, nbufs C.int, dtype C.int, root C.int,
	step C.uint64_t, bucket C.int32_t, work *C.int64_t) (rc C.int) {
	defer guard("ddpshim_broadcast", &rc)
	c, err := lib.comm(int64(comm))
	if err != nil {
		return fail(err)
	}
	switch {
	case work == nil:
		return fail(status.Errorf(status.Invalid, "ddpshim_broadcast: work must not be NULL"))
	case nbufs < 0 || nbufs > maxBroadcastBufs:
		return fail(status.Errorf(status.Invalid, "ddpshim_broadcast: nbufs %d is not in 0..%d", nbufs, maxBroadcastBufs))
	case nbufs > 0 && (bufs == nil || counts == nil):
		return fail(status.Errorf(status.Invalid, "ddpshim_broadcast: bufs or counts is NULL with nbufs %d", nbufs))
	case dtype < 0 || dtype > 255:
		return fail(status.Errorf(status.Invalid, "ddpshim_broadcast: unknown dtype %d", dtype))
	}
	var ptrs []unsafe.Pointer
	var ns []int64
	if nbufs > 0 {
		ptrs = unsafe.Slice(bufs, int(nbufs))
		for _, n := range unsafe.Slice(counts, int(nbufs)) {
			ns = append(ns, int64(n))
		}
	}
	w, err := c.Broadcast(ptrs, ns, reduce.DType(dtype), int(root), uint64(step), int32(bucket))
	if err != nil {
		return fail(fmt.Errorf("ddpshim_broadcast: %w", err))
	}
	*work = C.int64_t(lib.addWork(w))
	return status.OK
}

// maxBroadcastBufs bounds ddpshim_broadcast's nbufs: far more than a
// model's tensors (the shared-memory transport's table takes as many).
const maxBroadcastBufs = 1 << 20

//export ddpshim_mark
func ddpshim_mark(comm C.int64_t, step C.uint64_t, kind C.int) (rc C.int) {
	defer guard("ddpshim_mark", &rc)
	c, err := lib.comm(int64(comm))
	if err != nil {
		return fail(err)
	}
	if kind != C.int(wire.MarkForward) {
		return fail(status.Errorf(status.Invalid, "ddpshim_mark: unknown kind %d", kind))
	}
	c.Mark(uint64(step), uint32(kind))
	return status.OK
}

//export ddpshim_work_wait
func ddpshim_work_wait(work C.int64_t) (rc C.int) {
	defer guard("ddpshim_work_wait", &rc)
	w, err := lib.work(int64(work))
	if err != nil {
		return fail(err)
	}
	return result(w.WaitFromC())
}

//export ddpshim_work_test
func ddpshim_work_test(work C.int64_t, done *C.int) (rc C.int) {
	defer guard("ddpshim_work_test", &rc)
	w, err := lib.work(int64(work))
	if err != nil {
		return fail(err)
	}
	if done == nil {
		return fail(status.Errorf(status.Invalid, "ddpshim_work_test: done must not be NULL"))
	}
	*done = 0
	if w.Test() {
		*done = 1
	}
	return status.OK
}

//export ddpshim_work_free
func ddpshim_work_free(work C.int64_t) (rc C.int) {
	defer guard("ddpshim_work_free", &rc)
	return result(lib.freeWork(int64(work)))
}

//export ddpshim_abort
func ddpshim_abort(comm C.int64_t, reason *C.char) (rc C.int) {
	defer guard("ddpshim_abort", &rc)
	c, err := lib.comm(int64(comm))
	if err != nil {
		return fail(err)
	}
	why := "ddpshim_abort called"
	if reason != nil {
		why = C.GoString(reason)
	}
	c.Abort(errors.New(why))
	return status.OK
}

//export ddpshim_reformed
func ddpshim_reformed(handle C.int64_t, report *C.char) (rc C.int) {
	defer guard("ddpshim_reformed", &rc)
	c, err := lib.comm(int64(handle))
	if err != nil {
		return fail(err)
	}
	if report == nil {
		return fail(status.Errorf(status.Invalid, "ddpshim_reformed: report must not be NULL"))
	}
	m, err := comm.ParseReformed(C.GoString(report))
	if err != nil {
		return fail(err)
	}
	return result(c.Reformed(m))
}

//export ddpshim_close
func ddpshim_close(comm C.int64_t) (rc C.int) {
	defer guard("ddpshim_close", &rc)
	c, err := lib.takeComm(int64(comm))
	if err != nil {
		return fail(err)
	}
	c.Close()
	return status.OK
}

//export ddpshim_nccl_info
func ddpshim_nccl_info(buf *C.char, n C.size_t) (rc C.int) {
	defer guard("ddpshim_nccl_info", &rc)
	return result(copyOut(buf, n, comm.NCCLInfo()))
}

//export ddpshim_comm_info
func ddpshim_comm_info(comm C.int64_t, buf *C.char, n C.size_t) (rc C.int) {
	defer guard("ddpshim_comm_info", &rc)
	c, err := lib.comm(int64(comm))
	if err != nil {
		return fail(err)
	}
	return result(copyOut(buf, n, c.Describe()))
}

// copyOut writes s and a NUL into the caller's buffer of n bytes.
func copyOut(buf *C.char, n C.size_t, s string) error {
	if buf == nil {
		return status.Errorf(status.Invalid, "buf must not be NULL")
	}
	if uint64(n) < uint64(len(s))+1 {
		return status.Errorf(status.Invalid, "buffer of %d bytes is too small: %d needed", n, len(s)+1)
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(s)+1)
	copy(dst, s)
	dst[len(s)] = 0
	return nil
}
