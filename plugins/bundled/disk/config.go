package disk

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/bundled/internal/opts"
)

const (
	defaultInterval   = "30s"
	defaultMinFree    = "5%"
	defaultMinInodes  = "1%"
	defaultMaxLatency = "2s"
	defaultTimeout    = "10s"
)

// config is the checked options.
type config struct {
	paths      []string // absolute, cleaned
	interval   time.Duration
	minFree    bar // bytes
	minInodes  bar // inodes
	maxLatency time.Duration
	timeout    time.Duration
}

// parseConfig checks every option's value; it does not look at the disk.
func parseConfig(cfg plugins.Config) (config, error) {
	var c config
	var err error
	for _, p := range opts.List(cfg.Get("paths", "")) {
		abs, err := filepath.Abs(p)
		if err != nil {
			return config{}, fmt.Errorf("option paths: %q: %w", p, err)
		}
		c.paths = append(c.paths, abs)
	}
	if len(c.paths) == 0 {
		return config{}, errors.New("option paths: no directory given (a comma list: paths=/ckpt,/var/log/job)")
	}
	if c.interval, err = opts.Duration(cfg, "interval", defaultInterval); err != nil {
		return config{}, err
	}
	if c.minFree, err = parseBar(cfg.Get("min-free", defaultMinFree), true); err != nil {
		return config{}, fmt.Errorf("option min-free: %w", err)
	}
	if c.minInodes, err = parseBar(cfg.Get("min-inodes", defaultMinInodes), false); err != nil {
		return config{}, fmt.Errorf("option min-inodes: %w", err)
	}
	if c.maxLatency, err = opts.Duration(cfg, "max-write-latency", defaultMaxLatency); err != nil {
		return config{}, err
	}
	if c.timeout, err = opts.Duration(cfg, "timeout", defaultTimeout); err != nil {
		return config{}, err
	}
	return c, nil
}
