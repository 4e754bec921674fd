package health

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestActionText(t *testing.T) {
	for a := ActionIgnore; a <= ActionDrainNode; a++ {
		b, err := a.MarshalText()
		if err != nil {
			t.Fatalf("MarshalText(%d): %v", a, err)
		}
		var got Action
		if err := got.UnmarshalText(b); err != nil || got != a {
			t.Errorf("round trip of %v: got %v, %v", a, got, err)
		}
	}
	if _, err := Action(7).MarshalText(); err == nil {
		t.Error("MarshalText(7) succeeded, want an error")
	}
	if s := Action(7).String(); s != "HealthAction(7)" {
		t.Errorf("String() = %q, want HealthAction(7)", s)
	}
	b, err := json.Marshal(Finding{GPU: 3, UUID: "GPU-x", Ranks: []int{3, 11}, Kind: KindXID, XID: 48, Action: ActionResetGPU, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"action":"reset-gpu"`, `"kind":"xid"`, `"xid":48`, `"ranks":[3,11]`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON %s lacks %s", b, want)
		}
	}
}

func TestDecide(t *testing.T) {
	f := func(actions ...Action) []Finding {
		var out []Finding
		for _, a := range actions {
			out = append(out, Finding{Action: a})
		}
		return out
	}
	tests := []struct {
		name     string
		findings []Finding
		want     Action
	}{
		{"none", nil, ActionIgnore},
		{"warnings only", f(ActionIgnore, ActionIgnore), ActionIgnore},
		{"restart wins over ignore", f(ActionIgnore, ActionRestartWorkers), ActionRestartWorkers},
		{"reset wins over restart", f(ActionRestartWorkers, ActionResetGPU, ActionIgnore), ActionResetGPU},
		{"drain wins over all", f(ActionResetGPU, ActionDrainNode, ActionRestartWorkers), ActionDrainNode},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Decide(tc.findings); got != tc.want {
				t.Errorf("Decide = %v, want %v", got, tc.want)
			}
		})
	}
}
