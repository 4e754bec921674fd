package health

import (
	"slices"
	"strings"
	"testing"
)

func TestXIDClassify(t *testing.T) {
	tests := []struct {
		name string
		code uint64
		want Action
	}{
		{"13 graphics engine exception", 13, ActionRestartWorkers},
		{"31 GPU memory page fault", 31, ActionRestartWorkers},
		{"43 GPU stopped processing", 43, ActionRestartWorkers},
		{"45 preemptive cleanup", 45, ActionIgnore},
		{"48 double-bit ECC", 48, ActionResetGPU},
		{"63 row remapping pending", 63, ActionIgnore},
		{"64 row remapping failure", 64, ActionDrainNode},
		{"74 NVLink error", 74, ActionResetGPU},
		{"79 fallen off the bus", 79, ActionDrainNode},
		{"92 high single-bit ECC rate", 92, ActionIgnore},
		{"94 contained ECC", 94, ActionRestartWorkers},
		{"95 uncontained ECC", 95, ActionResetGPU},
		{"109 context switch timeout", 109, ActionResetGPU},
		{"119 GSP RPC timeout", 119, ActionResetGPU},
		{"120 GSP error", 120, ActionResetGPU},
		{"8 GPU stopped processing", 8, ActionRestartWorkers},
		{"32 push buffer stream", 32, ActionRestartWorkers},
		{"38 firmware watchdog", 38, ActionIgnore},
		{"56 display engine", 56, ActionIgnore},
		{"57 memory interface", 57, ActionResetGPU},
		{"61 micro-controller breakpoint", 61, ActionResetGPU},
		{"62 micro-controller halt", 62, ActionResetGPU},
		{"68 NVDEC0", 68, ActionRestartWorkers},
		{"69 graphics class error", 69, ActionRestartWorkers},
		{"73 NVENC2", 73, ActionRestartWorkers},
		{"121 C2C corrected", 121, ActionIgnore},
		{"140 ECC escape", 140, ActionResetGPU},
		{"149 NVLink link fatal", 149, ActionResetGPU},
		{"151 key rotation", 151, ActionDrainNode},
		{"NVML unknown 999", XIDUnknown, ActionRestartWorkers},
		{"not in the catalog", 12345, ActionRestartWorkers},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := XIDClassify(tc.code)
			if x.Action != tc.want {
				t.Errorf("XIDClassify(%d).Action = %v, want %v", tc.code, x.Action, tc.want)
			}
			if x.Code != tc.code || x.Mnemonic == "" || x.Description == "" {
				t.Errorf("XIDClassify(%d) = %+v, want code, mnemonic and description", tc.code, x)
			}
			_, known := XIDLookup(tc.code)
			if wantKnown := tc.code != XIDUnknown && tc.code != 12345; known != wantKnown {
				t.Errorf("XIDLookup(%d) known = %v, want %v", tc.code, known, wantKnown)
			}
		})
	}
}

func TestXIDCatalog(t *testing.T) {
	cat := XIDCatalog()
	if len(cat) < 60 {
		t.Fatalf("catalog has %d entries, want at least 60", len(cat))
	}
	if !slices.IsSortedFunc(cat, func(a, b XIDInfo) int { return int(a.Code) - int(b.Code) }) {
		t.Error("catalog not sorted by code")
	}
	for _, x := range cat {
		if x.Mnemonic == "" || x.Description == "" || x.Action < ActionIgnore || x.Action > ActionDrainNode {
			t.Errorf("entry %+v incomplete", x)
		}
		if x.Mnemonic != strings.ToUpper(x.Mnemonic) || strings.Contains(x.Mnemonic, " ") {
			t.Errorf("Xid %d mnemonic %q not an NVIDIA mnemonic", x.Code, x.Mnemonic)
		}
	}
}
