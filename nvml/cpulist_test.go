package nvml

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want CPUList
		text string
	}{
		{"", CPUList{}, ""},
		{"0\n", CPUList{0}, "0"},
		{"0-3", CPUList{0, 1, 2, 3}, "0-3"},
		{"0-1,4,6-7", CPUList{0, 1, 4, 6, 7}, "0-1,4,6-7"},
		{"8-9, 0-1 ,1", CPUList{0, 1, 8, 9}, "0-1,8-9"},
		{"48-63,176-191", append(seq(48, 63), seq(176, 191)...), "48-63,176-191"},
	} {
		got, err := ParseCPUList(tc.in)
		if err != nil {
			t.Errorf("ParseCPUList(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseCPUList(%q): got %v, want %v", tc.in, got, tc.want)
		}
		if s := got.String(); s != tc.text {
			t.Errorf("String(%v): got %q, want %q", got, s, tc.text)
		}
	}
	for _, bad := range []string{"a", "1-", "-1", "3-1", "1,,2", "0-99999999"} {
		if l, err := ParseCPUList(bad); err == nil {
			t.Errorf("ParseCPUList(%q): got %v, want an error", bad, l)
		}
	}
}

func TestCPUListJSON(t *testing.T) {
	in := struct {
		L CPUList `json:"l"`
	}{CPUList{0, 1, 2, 5}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"l":"0-2,5"}` {
		t.Errorf("got %s, want {\"l\":\"0-2,5\"}", b)
	}
	in.L = nil
	if err := json.Unmarshal(b, &in); err != nil || !reflect.DeepEqual(in.L, CPUList{0, 1, 2, 5}) {
		t.Errorf("round trip: got %v, %v", in.L, err)
	}
}

func TestMaskToList(t *testing.T) {
	for _, l := range []CPUList{{}, {0}, {0, 63, 64, 65, 127, 128}, seq(16, 31)} {
		if got := maskToList(listToMask(l)); !reflect.DeepEqual(got, l) {
			t.Errorf("maskToList(listToMask(%v)): got %v", l, got)
		}
	}
	if got := maskToList([]uint{0b1010, 0, 1}); !reflect.DeepEqual(got, CPUList{1, 3, 128}) {
		t.Errorf("maskToList: got %v, want [1 3 128]", got)
	}
}

func seq(a, b int) CPUList {
	var l CPUList
	for i := a; i <= b; i++ {
		l = append(l, i)
	}
	return l
}
