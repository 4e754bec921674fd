// Package nccl is the shim's NCCL transport: NCCL resolved at run time into
// a C function table (nothing links against NCCL or CUDA at build time, so
// the package builds with gcc alone), and a communicator over it whose every
// wait is bounded and abortable.
//
// Load finds NCCL in this order: the symbols already in the process
// (dlsym(RTLD_DEFAULT, ...): the NCCL PyTorch loaded), then
// dlopen("libnccl.so.2"), then an explicit path (DDP_AGENT_NCCL_LIB, which
// the caller reads). The version from ncclGetVersion gates what is used:
// ncclAvg and ncclBfloat16 from 2.10, ncclGetLastError from 2.13,
// non-blocking communicators (ncclCommInitRankConfig with blocking=0) and
// ncclCommFinalize from 2.14.
//
// A Comm from Open is one rank of an NCCL communicator. NCCL allows one
// thread at a time per communicator, so AllReduce and Close take turns;
// Abort, AsyncError and Close may be called from any goroutine at any time,
// and Abort makes a collective blocked in NCCL return.
//
// Stream semantics: NCCL collectives are asynchronous on the CUDA stream.
// AllReduce returns when NCCL has enqueued the operation, not when the data
// has arrived; completion is observed on the stream (an event). On a
// non-blocking communicator ncclAllReduce's implicit group end
// (ncclGroupEndInternal in NVIDIA/nccl src/group.cc) sets the
// communicator's state to ncclInProgress, hands the launch to a background
// thread (groupLaunchNonBlocking) and returns ncclInProgress: the kernel is
// on the stream only once ncclCommGetAsyncError has left ncclInProgress, and
// until then the stream must not be touched (no event recorded on it, no
// other NCCL call on the communicator). That is why AllReduce polls to the
// end before returning.
//
// The C side (ddpnccl.h) is usable without the Go runtime, for the shim's
// hot path.
package nccl

// #cgo LDFLAGS: -ldl -lpthread
// #include <stdlib.h>
// #include "ddpnccl.h"
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/failure"
)

// Data types (ncclDataType_t values).
const (
	Int8     = 0
	Uint8    = 1
	Int32    = 2
	Uint32   = 3
	Int64    = 4
	Uint64   = 5
	Float16  = 6
	Float32  = 7
	Float64  = 8
	BFloat16 = 9 // NCCL 2.10
)

// Reduction ops (ncclRedOp_t values).
const (
	Sum  = 0
	Prod = 1
	Max  = 2
	Min  = 3
	Avg  = 4 // NCCL 2.10
)

// UniqueIDBytes is NCCL_UNIQUE_ID_BYTES.
const UniqueIDBytes = C.NCCL_UNIQUE_ID_BYTES

// Source names for Lib.Source, besides an explicit path.
const (
	FromProcess = "process"
	FromSoname  = "libnccl.so.2"
)

// Version is an NCCL version.
type Version struct {
	Major, Minor, Patch int
	Code                int // as ncclGetVersion returned it
}

// ParseVersion decodes an NCCL_VERSION_CODE: X*1000+Y*100+Z up to 2.8
// (2804 is 2.8.4), X*10000+Y*100+Z from 2.9 on (21903 is 2.19.3).
func ParseVersion(code int) Version {
	if code < 10000 {
		return Version{Major: code / 1000, Minor: code % 1000 / 100, Patch: code % 100, Code: code}
	}
	return Version{Major: code / 10000, Minor: code % 10000 / 100, Patch: code % 100, Code: code}
}

// VersionCode is nccl.h's NCCL_VERSION(major, minor, patch).
func VersionCode(major, minor, patch int) int {
	if major <= 2 && minor <= 8 {
		return major*1000 + minor*100 + patch
	}
	return major*10000 + minor*100 + patch
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v is major.minor.patch or newer.
func (v Version) AtLeast(major, minor, patch int) bool {
	if v.Major != major {
		return v.Major > major
	}
	if v.Minor != minor {
		return v.Minor > minor
	}
	return v.Patch >= patch
}

// Features are what this Lib uses, by version and by the symbols found.
type Features struct {
	Avg         bool // ncclAvg (2.10)
	BFloat16    bool // ncclBfloat16 (2.10)
	LastError   bool // ncclGetLastError (2.13)
	NonBlocking bool // ncclCommInitRankConfig with blocking=0 (2.14)
	Finalize    bool // ncclCommFinalize (2.14)
}

// Lib is one loaded NCCL. It is never unloaded (NCCL keeps threads and
// CUDA state for the life of the process) and safe for concurrent use.
type Lib struct {
	t        *C.ddpnccl_lib // C memory, never freed
	source   string
	version  Version
	features Features
}

// Load resolves NCCL: the process's own symbols, then
// dlopen("libnccl.so.2"), then path when it is not "" (the caller passes
// $DDP_AGENT_NCCL_LIB). A place whose library opens but lacks a required
// symbol is passed over. It returns a *LoadError naming every place tried
// and why each failed when none works.
func Load(path string) (*Lib, error) {
	t := (*C.ddpnccl_lib)(C.calloc(1, C.sizeof_ddpnccl_lib))
	var errbuf [512]C.char
	le := &LoadError{}
	try := func(where, path string) bool {
		var cpath *C.char // nil: the process's own symbols
		if path != "" {
			cpath = C.CString(path)
			defer C.free(unsafe.Pointer(cpath))
		}
		if C.ddpnccl_open(t, cpath, &errbuf[0], C.size_t(len(errbuf))) == 0 {
			return true
		}
		le.Tried = append(le.Tried, Attempt{Where: where, Err: C.GoString(&errbuf[0])})
		return false
	}
	source := ""
	switch {
	case try(FromProcess, ""):
		source = FromProcess
	case try(FromSoname, FromSoname):
		source = FromSoname
	case path == "":
		le.Tried = append(le.Tried, Attempt{Where: "explicit path", Err: "none given (DDP_AGENT_NCCL_LIB is empty)"})
	case try(path, path):
		source = path
	}
	if source == "" {
		C.free(unsafe.Pointer(t))
		return nil, le
	}
	var code C.int
	if r := C.ddpnccl_get_version(t, &code); r != C.ncclSuccess {
		return nil, fmt.Errorf("nccl from %s: ncclGetVersion: %s", source, Result(r))
	}
	l := &Lib{t: t, source: source, version: ParseVersion(int(code))}
	v := l.version
	l.features = Features{
		Avg:         v.AtLeast(2, 10, 0),
		BFloat16:    v.AtLeast(2, 10, 0),
		LastError:   v.AtLeast(2, 13, 0) && t.getLastError != nil,
		NonBlocking: v.AtLeast(2, 14, 0) && t.commInitRankConfig != nil,
		Finalize:    v.AtLeast(2, 14, 0) && t.commFinalize != nil,
	}
	return l, nil
}

// Source says where NCCL came from: FromProcess, FromSoname or the path.
func (l *Lib) Source() string { return l.source }

// Version is the version ncclGetVersion reported.
func (l *Lib) Version() Version { return l.version }

// Features says what this NCCL offers.
func (l *Lib) Features() Features { return l.features }

// UniqueID calls ncclGetUniqueId; one rank does, and the bootstrap hands
// the id to the others. It does not block on other ranks.
func (l *Lib) UniqueID() ([UniqueIDBytes]byte, error) {
	var id [UniqueIDBytes]byte
	if r := C.ddpnccl_get_unique_id(l.t, (*C.ncclUniqueId)(unsafe.Pointer(&id[0]))); r != C.ncclSuccess {
		return id, l.errorOf("ncclGetUniqueId", r)
	}
	return id, nil
}

// errorOf builds NCCL's message for r, with ncclGetLastError when the
// version has it.
func (l *Lib) errorOf(op string, r C.ncclResult_t) *Error {
	e := &Error{Op: op, Result: Result(r), Text: C.GoString(C.ddpnccl_error_string(l.t, r))}
	if l.features.LastError {
		e.Last = C.GoString(C.ddpnccl_last_error(l.t))
	}
	return e
}

// checkOp validates a data type and op against NCCL's enums and this
// version.
func (l *Lib) checkOp(dtype, op int) error {
	switch {
	case dtype < Int8 || dtype > BFloat16:
		return fmt.Errorf("%w: data type %d", failure.ErrInvalid, dtype)
	case op < Sum || op > Avg:
		return fmt.Errorf("%w: reduction op %d", failure.ErrInvalid, op)
	case dtype == BFloat16 && !l.features.BFloat16:
		return fmt.Errorf("%w: bfloat16 needs NCCL 2.10, have %s", ErrUnsupported, l.version)
	case op == Avg && !l.features.Avg:
		return fmt.Errorf("%w: ncclAvg needs NCCL 2.10, have %s", ErrUnsupported, l.version)
	}
	return nil
}

// configSize is sizeof our ncclConfig_t, as NCCL sees it in config.size.
func configSize() int { return C.sizeof_ncclConfig_t }

// configVersion is the NCCL_VERSION our ncclConfig_t declares.
func configVersion() int { return C.DDPNCCL_CONFIG_VERSION }
