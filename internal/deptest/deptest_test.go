package deptest

import (
	"slices"
	"testing"
)

const module = "github.com/ddp-agent/ddp-agent"

func TestForbidden(t *testing.T) {
	transports := []string{module + "/shim/host", module + "/shim/nccl"}
	tests := []struct {
		name     string
		deps     []string
		prefixes []string
		want     []string
	}{
		{"none", []string{"fmt", module + "/shim/failure"}, transports, nil},
		{"exact", []string{"fmt", module + "/shim/nccl"}, transports, []string{module + "/shim/nccl"}},
		{"below", []string{module + "/shim/host/shm"}, transports, []string{module + "/shim/host/shm"}},
		{"a name that only starts alike", []string{module + "/shim/hostile"}, transports, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Forbidden(tc.deps, tc.prefixes); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestList(t *testing.T) {
	deps := List(t, module+"/internal/deptest", module+"/internal/envname")
	if !slices.Contains(deps[module+"/internal/deptest"], "os/exec") {
		t.Errorf("deptest's deps %v lack os/exec", deps[module+"/internal/deptest"])
	}
	if got := deps[module+"/internal/envname"]; len(got) != 0 {
		t.Errorf("envname's deps: got %v, want none", got)
	}
}
