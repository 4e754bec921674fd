package rdzv

import (
	"errors"
	"strings"
	"testing"
)

func TestRefusals(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 1, 2)
	cfg.Hosted, cfg.Token = true, "secret"
	open(t, dial(), cfg)

	other := cfg
	other.Hosted, other.JobID, other.Prefix = false, "otherjob", Prefix(RootPrefix, "otherjob")
	var fe *ForeignJobError
	if _, err := Open(t.Context(), dial(), other); !errors.As(err, &fe) || !strings.Contains(err.Error(), `"job"`) {
		t.Fatalf("agent of another job: %v", err)
	}
	wrong := cfg
	wrong.Hosted, wrong.Token = false, "guess"
	if _, err := Open(t.Context(), dial(), wrong); !errors.Is(err, ErrTokenMismatch) {
		t.Fatalf("wrong token: %v", err)
	}
	wrong.Token = ""
	if _, err := Open(t.Context(), dial(), wrong); !errors.Is(err, ErrTokenMismatch) {
		t.Fatalf("missing token: %v", err)
	}
}
