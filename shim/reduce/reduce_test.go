package reduce

import (
	"encoding/binary"
	"math"
	"testing"
)

func TestHalfRoundTrip(t *testing.T) {
	for _, dt := range []DType{Float16, BFloat16} {
		buf := make([]byte, 2*65536)
		for i := 0; i < 65536; i++ {
			binary.LittleEndian.PutUint16(buf[2*i:], uint16(i))
		}
		back := Encode(dt, Decode(dt, buf))
		for i := 0; i < 65536; i++ {
			got := binary.LittleEndian.Uint16(back[2*i:])
			if math.IsNaN(Decode(dt, buf[2*i:2*i+2])[0]) {
				if !math.IsNaN(Decode(dt, back[2*i:2*i+2])[0]) {
					t.Errorf("%v %#04x: NaN became %#04x", dt, i, got)
				}
				continue
			}
			if got != uint16(i) {
				t.Errorf("%v %#04x: round trip gave %#04x", dt, i, got)
			}
		}
	}
}

func TestKnownValues(t *testing.T) {
	tests := []struct {
		name string
		dt   DType
		in   float64
		want float64
	}{
		{"f16 one", Float16, 1, 1},
		{"f16 max", Float16, 65504, 65504},
		{"f16 overflow", Float16, 65520, math.Inf(1)},
		{"f16 ties to even", Float16, 1 + 1.0/2048, 1},
		{"f16 rounds up", Float16, 1 + 3.0/2048, 1 + 2.0/1024},
		{"f16 smallest subnormal", Float16, math.Ldexp(1, -24), math.Ldexp(1, -24)},
		{"f16 underflow", Float16, math.Ldexp(1, -26), 0},
		{"bf16 ties to even", BFloat16, 1 + 1.0/256, 1},
		{"bf16 rounds up", BFloat16, 1 + 3.0/256, 1 + 2.0/128},
		{"i32 truncates", Int32, -2.7, -2},
		{"i64 large", Int64, 1 << 40, 1 << 40},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Decode(tc.dt, Encode(tc.dt, []float64{tc.in}))[0]
			if got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAddAndDiv(t *testing.T) {
	// 1037 elements: not a multiple of any vector width.
	const n = 1037
	for _, dt := range DTypes {
		t.Run(dt.String(), func(t *testing.T) {
			a, b := make([]float64, n), make([]float64, n)
			for i := range a {
				a[i] = float64(i%97) - 40
				b[i] = float64((i*7)%53) * 0.5
				if !dt.Float() {
					b[i] = math.Trunc(b[i])
				}
			}
			ea, eb := Encode(dt, a), Encode(dt, b)
			Add(dt, ea, ea, eb) // dst aliases a
			sum := Decode(dt, ea)
			for i := range sum {
				if want := a[i] + b[i]; sum[i] != want {
					t.Fatalf("sum[%d]: got %v, want %v", i, sum[i], want)
				}
			}
			Div(dt, ea, 4)
			q := Decode(dt, ea)
			for i := range q {
				want := Decode(dt, Encode(dt, []float64{(a[i] + b[i]) / 4}))[0]
				if !dt.Float() {
					want = math.Trunc((a[i] + b[i]) / 4)
				}
				if q[i] != want {
					t.Fatalf("avg[%d]: got %v, want %v", i, q[i], want)
				}
			}
		})
	}
}

func TestIntegerOverflowWraps(t *testing.T) {
	a := Encode(Int32, []float64{math.MaxInt32})
	Add(Int32, a, a, Encode(Int32, []float64{1}))
	if got := Decode(Int32, a)[0]; got != math.MinInt32 {
		t.Errorf("got %v, want %v", got, math.MinInt32)
	}
}

func TestValidity(t *testing.T) {
	if DType(3).Valid() || DType(0).Size() != 0 || Op(1).Valid() || !Avg.Valid() {
		t.Error("validity of unknown values is wrong")
	}
	defer func() {
		if recover() == nil {
			t.Error("Add with mismatched lengths did not panic")
		}
	}()
	Add(Float32, make([]byte, 8), make([]byte, 4), make([]byte, 8))
}

func BenchmarkAdd(b *testing.B) {
	for _, dt := range []DType{Float32, BFloat16, Float16} {
		b.Run(dt.String(), func(b *testing.B) {
			x, y := make([]byte, 1<<20), make([]byte, 1<<20)
			b.SetBytes(1 << 20)
			for i := 0; i < b.N; i++ {
				Add(dt, x, x, y)
			}
		})
	}
}
