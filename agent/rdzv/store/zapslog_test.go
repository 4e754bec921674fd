package store

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
)

func TestZapLogger(t *testing.T) {
	var buf bytes.Buffer
	lg := zapLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	lg = lg.Named("raft").With(zap.String("member", "m0"))
	lg.Info("chatty")
	lg.Debug("chattier")
	lg.Warn("slow apply", zap.Duration("took", 0), zap.Error(errors.New("boom")))
	lg.Error("failed", zap.Int("n", 3))

	out := buf.String()
	if strings.Contains(out, "chatty") {
		t.Errorf("info or debug forwarded:\n%s", out)
	}
	for _, want := range []string{
		`level=WARN msg="slow apply" logger=raft member=m0 took=0s error=boom`,
		`level=ERROR msg=failed logger=raft member=m0 n=3`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// Two learners added at once: etcd refuses one and logs an error the
	// replica manager expects; any other refusal stays an error.
	buf.Reset()
	lg.Error("Validation on configuration change failed", zap.Bool("shouldApplyV3", true),
		zap.Error(errors.New("membership: too many learner members in cluster")))
	lg.Error("Validation on configuration change failed", zap.Error(errors.New("membership: ID exists")))
	out = buf.String()
	if !strings.Contains(out, `level=DEBUG msg="Validation on configuration change failed" logger=raft member=m0 shouldApplyV3=true error="membership: too many learner members in cluster"`) ||
		!strings.Contains(out, `level=ERROR msg="Validation on configuration change failed" logger=raft member=m0 error="membership: ID exists"`) {
		t.Errorf("the learners' race is not at debug, or another refusal is not an error:\n%s", out)
	}

	// A learner promoted before it caught up: refused, and tried again.
	buf.Reset()
	lg.Error("rejecting promote learner: learner is not ready", zap.Float64("learner-ready-percent", 0.5))
	if out = buf.String(); !strings.Contains(out, `level=DEBUG msg="rejecting promote learner: learner is not ready"`) {
		t.Errorf("an early promotion's refusal is not at debug:\n%s", out)
	}

	// nil discards.
	zapLogger(nil).Error("nowhere")
}
