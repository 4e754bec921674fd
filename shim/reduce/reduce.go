// Package reduce holds the element types, reduction ops and vectorized
// reduction kernels shared by the shim's host transports. Types and ops use
// NCCL's enum values so the C ABI passes them to NCCL unchanged.
package reduce

// #cgo CFLAGS: -O3
// #include "kernels.h"
import "C"

import (
	"fmt"
	"unsafe"
)

// DType is an element type; values are ncclDataType_t's.
type DType uint8

// Supported element types.
const (
	Int32    DType = 2
	Int64    DType = 4
	Float16  DType = 6
	Float32  DType = 7
	Float64  DType = 8
	BFloat16 DType = 9
)

// DTypes lists every supported element type.
var DTypes = []DType{Int32, Int64, Float16, Float32, Float64, BFloat16}

// Size returns the element size in bytes, or 0 for an unknown type.
func (d DType) Size() int {
	switch d {
	case Int32, Float32:
		return 4
	case Int64, Float64:
		return 8
	case Float16, BFloat16:
		return 2
	}
	return 0
}

// Valid reports whether d is a supported element type.
func (d DType) Valid() bool { return d.Size() != 0 }

// Float reports whether d is a floating-point type.
func (d DType) Float() bool { return d == Float16 || d == Float32 || d == Float64 || d == BFloat16 }

func (d DType) String() string {
	switch d {
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Float16:
		return "float16"
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case BFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Op is a reduction; values are ncclRedOp_t's.
type Op uint8

// Supported reductions. Avg is the sum divided once by the number of ranks
// (integers truncate toward zero, as in NCCL).
const (
	Sum Op = 0
	Avg Op = 4
)

// Valid reports whether o is a supported reduction.
func (o Op) Valid() bool { return o == Sum || o == Avg }

func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Avg:
		return "avg"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Add sets dst = a + b element-wise; dst may be a or b. Half-precision
// types add in float32 and round to nearest even once. The three slices must
// have the same length, a multiple of dt.Size(); Add panics otherwise.
func Add(dt DType, dst, a, b []byte) {
	n := count(dt, len(dst))
	if len(a) != len(dst) || len(b) != len(dst) {
		panic(fmt.Sprintf("reduce.Add: lengths %d, %d, %d differ", len(dst), len(a), len(b)))
	}
	if n == 0 {
		return
	}
	C.ddpr_add(C.int(dt), unsafe.Pointer(&dst[0]), unsafe.Pointer(&a[0]), unsafe.Pointer(&b[0]), C.size_t(n))
}

// Div divides every element of buf by d (d > 0).
func Div(dt DType, buf []byte, d int) {
	n := count(dt, len(buf))
	if d <= 0 {
		panic(fmt.Sprintf("reduce.Div: divisor %d", d))
	}
	if n == 0 || d == 1 {
		return
	}
	C.ddpr_div(C.int(dt), unsafe.Pointer(&buf[0]), C.size_t(n), C.int64_t(d))
}

// Encode converts vals to dt (rounding to nearest even for floats,
// truncating for integers) and returns the bytes.
func Encode(dt DType, vals []float64) []byte {
	out := make([]byte, len(vals)*mustSize(dt))
	if len(vals) > 0 {
		C.ddpr_encode(C.int(dt), unsafe.Pointer(&out[0]), (*C.double)(unsafe.Pointer(&vals[0])), C.size_t(len(vals)))
	}
	return out
}

// Decode converts the elements in buf to float64.
func Decode(dt DType, buf []byte) []float64 {
	n := count(dt, len(buf))
	out := make([]float64, n)
	if n > 0 {
		C.ddpr_decode(C.int(dt), (*C.double)(unsafe.Pointer(&out[0])), unsafe.Pointer(&buf[0]), C.size_t(n))
	}
	return out
}

func mustSize(dt DType) int {
	s := dt.Size()
	if s == 0 {
		panic(fmt.Sprintf("reduce: unknown %v", dt))
	}
	return s
}

func count(dt DType, nbytes int) int {
	s := mustSize(dt)
	if nbytes%s != 0 {
		panic(fmt.Sprintf("reduce: %d bytes is not a whole number of %v", nbytes, dt))
	}
	return nbytes / s
}
