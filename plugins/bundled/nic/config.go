package nic

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/bundled/internal/opts"
)

const (
	defaultInterval = "5s"
	defaultSysfs    = "/sys"
)

// config is the checked options.
type config struct {
	interfaces []string // as named by the user; nil: choose at Configure
	interval   time.Duration
	minRate    int64 // Mb/s; 0: no check
	sysfs      string
}

// parseConfig checks every option's value; it does not look at the
// node (resolvePorts does).
func parseConfig(cfg plugins.Config) (config, error) {
	interval, err := opts.Duration(cfg, "interval", defaultInterval)
	if err != nil {
		return config{}, err
	}
	v := cfg.Get("min-rate", "0")
	minRate, err := strconv.ParseInt(v, 10, 64)
	if err != nil || minRate < 0 {
		return config{}, fmt.Errorf("option min-rate: %q is not a whole number of Mb/s (0 or more; 100000 for 100 Gb/s)", v)
	}
	sysfs := filepath.Clean(cfg.Get("sysfs", defaultSysfs))
	if !filepath.IsAbs(sysfs) {
		return config{}, fmt.Errorf("option sysfs: %q is not an absolute path", sysfs)
	}
	if st, err := os.Stat(filepath.Join(sysfs, "class", "net")); err != nil || !st.IsDir() {
		return config{}, fmt.Errorf("option sysfs: %s has no class/net: not a sysfs mount", sysfs)
	}
	return config{
		interfaces: opts.List(cfg.Get("interfaces", "")),
		interval:   interval,
		minRate:    minRate,
		sysfs:      sysfs,
	}, nil
}
