// Package nic is the bundled detector that watches the node's network
// ports: the Ethernet interfaces in /sys/class/net and the InfiniBand
// ports in /sys/class/infiniband. A port the job uses that goes down, or
// loses its carrier, drains the node: the collectives over it stall until
// NCCL's timeout, and a restart on the same node stalls again. A port
// that flaps, or runs below the rate it should, is a warning.
package nic

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/bundled/internal/probe"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// version is this plugin's own version, in its Info.
const version = "0.1.0"

// Detector is the nic detector. Configure's settings are kept behind an
// atomic pointer: the plugin server may call Watch from another goroutine
// than the one that called Configure.
type Detector struct {
	settings atomic.Pointer[settings]
}

// settings is what Configure decided: the options and the ports they name.
type settings struct {
	config
	ports []port
}

// New returns an unconfigured nic detector.
func New() detector.Detector { return &Detector{} }

// Info describes the plugin and its options.
func (d *Detector) Info(context.Context) (plugins.Info, error) {
	return plugins.Info{
		Name:    "nic",
		Kind:    plugins.KindDetector,
		Version: version,
		Summary: "network ports (Ethernet carrier and InfiniBand state): a port down drains the node; flapping and a low rate warn",
		Options: []plugins.Option{
			{Name: "interfaces", Help: "comma list of interfaces (eth0) and InfiniBand devices (mlx5_0) or ports (mlx5_0/1) the job uses; " +
				"default: those up at start, device-backed ones only when there are any (a container's veth otherwise), never lo"},
			{Name: "interval", Default: defaultInterval, Help: "how often to check"},
			{Name: "min-rate", Default: "0", Help: "warn when a port runs below this many Mb/s (0: no check)"},
			{Name: "sysfs", Default: defaultSysfs, Help: "where sysfs is mounted (another root for a container's view)"},
		},
	}, nil
}

// Configure checks the options and resolves the ports to watch; a named
// interface that does not exist is an error here, before the job starts.
func (d *Detector) Configure(_ context.Context, cfg plugins.Config) (detector.Schedule, error) {
	info, _ := d.Info(context.Background())
	if err := cfg.Check(info); err != nil {
		return detector.Schedule{}, err
	}
	c, err := parseConfig(cfg)
	if err != nil {
		return detector.Schedule{}, fmt.Errorf("plugin nic: %w", err)
	}
	ports, err := resolvePorts(c.sysfs, c.interfaces)
	if err != nil {
		return detector.Schedule{}, fmt.Errorf("plugin nic: %w", err)
	}
	d.settings.Store(&settings{config: c, ports: ports})
	return detector.Schedule{Every: c.interval + readTimeout}, nil
}

// Watch checks every port each interval and emits one verdict per port,
// healthy or not, until ctx ends.
func (d *Detector) Watch(ctx context.Context, emit func(detector.Finding) error) error {
	s := d.settings.Load()
	if s == nil {
		return errors.New("plugin nic: Watch before Configure")
	}
	w := newWatcher(s.config, s.ports, readPort)
	return probe.Loop(ctx, s.interval, w.check, emit)
}
