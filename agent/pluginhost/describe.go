package pluginhost

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ddp-agent/ddp-agent/plugins"
)

// Bundled lists the bundled plugins' names (`ddp-agent-plugins --list`
// in dir).
func Bundled(ctx context.Context, dir string) ([]string, error) {
	bin := filepath.Join(dir, BundledBinary)
	out, err := exec.CommandContext(ctx, bin, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("list the bundled plugins with %s --list: %w (`make build` puts it next to ddp-agent, or set DDP_AGENT_PLUGIN_DIR)", bin, err)
	}
	return strings.Fields(string(out)), nil
}

// Describe starts each plugin of specs as `ddp-agent run` would (the same
// handshake) and returns its Info, without checking or configuring its
// options.
func Describe(ctx context.Context, dir string, specs []Spec, log *slog.Logger) ([]plugins.Info, error) {
	cfg := Config{Dir: dir}
	cfg.defaults()
	h := &Host{cfg: cfg, log: log, ctx: ctx}
	var infos []plugins.Info
	for _, sp := range specs {
		p, err := h.launch(ctx, Spec{Name: sp.Name, Path: sp.Path, Raw: sp.Raw, Config: plugins.Config{}})
		if err != nil {
			return infos, err
		}
		infos = append(infos, p.info)
		p.kill()
	}
	return infos, nil
}
