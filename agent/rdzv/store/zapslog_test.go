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

	// nil discards.
	zapLogger(nil).Error("nowhere")
}
