package pluginhost

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestHCLogKeysOnce: go-plugin's lines carry their own "plugin" (the
// executable's path); the adapter's "plugin" is the plugin's name, and a
// line gives each key once.
func TestHCLogKeysOnce(t *testing.T) {
	var buf bytes.Buffer
	l := newHCLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), "exec")
	l.Info("waiting for RPC address", "plugin", "/opt/ddp-agent-plugins")
	l.With("plugin", "/opt/other").Info("plugin exited")
	out := buf.String()
	for _, want := range []string{
		`msg="waiting for RPC address" plugin=exec plugin_path=/opt/ddp-agent-plugins`,
		`msg="plugin exited" plugin=exec plugin_path=/opt/other`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
