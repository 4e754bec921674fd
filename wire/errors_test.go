package wire

import (
	"errors"
	"testing"
)

// TestErrorCodes: the codes are on the wire, so their numbers never change
// (a new one is added at the end), and a RemoteError matches the sentinel
// of its code only.
func TestErrorCodes(t *testing.T) {
	tests := []struct {
		code ErrorCode
		num  uint16
		name string
		is   error
	}{
		{CodeBadRequest, 1, "bad request", nil},
		{CodeDenied, 2, "denied", ErrDenied},
		{CodeTimeout, 3, "timeout", ErrTimeout},
		{CodeStaleGeneration, 4, "stale generation", ErrStaleGeneration},
		{CodeInternal, 5, "internal", nil},
		{CodeLimit, 6, "limit exceeded", ErrLimit},
	}
	sentinels := []error{ErrDenied, ErrTimeout, ErrStaleGeneration, ErrLimit}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if uint16(tc.code) != tc.num || tc.code.String() != tc.name {
				t.Errorf("got %d %q, want %d %q", uint16(tc.code), tc.code, tc.num, tc.name)
			}
			err := error(&RemoteError{Code: tc.code, Message: "m"})
			for _, s := range sentinels {
				if got, want := errors.Is(err, s), s == tc.is; got != want {
					t.Errorf("errors.Is(%v, %v): got %v, want %v", err, s, got, want)
				}
			}
		})
	}
	if got := ErrorCode(7).String(); got != "code 7" {
		t.Errorf("unknown code: got %q, want %q", got, "code 7")
	}
}
