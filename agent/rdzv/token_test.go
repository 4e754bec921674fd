package rdzv

import (
	"strings"
	"testing"
)

func TestStretchToken(t *testing.T) {
	a, b := StretchToken("correct horse battery staple"), StretchToken("correct horse battery staple")
	if a != b || len(a) != 64 {
		t.Errorf("stretch gave %q then %q, want the same 64 hex digits", a, b)
	}
	if StretchToken("correct horse battery stapler") == a {
		t.Error("two tokens stretched alike")
	}
	if StretchToken("") != "" {
		t.Error("no token stretched to something")
	}
}

func TestCheckToken(t *testing.T) {
	if err := CheckToken("hunter2"); err == nil || !strings.Contains(err.Error(), "ddp-agent token") {
		t.Errorf("hunter2: %v, want a refusal that names ddp-agent token", err)
	}
	for _, ok := range []string{"", NewToken(), strings.Repeat("x", MinTokenLen)} {
		if err := CheckToken(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	if a, b := NewToken(), NewToken(); a == b || len(a) != 43 {
		t.Errorf("NewToken gave %q and %q", a, b)
	}
}
