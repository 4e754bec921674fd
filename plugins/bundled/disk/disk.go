// Package disk is the bundled detector that watches the directories a job
// writes to (checkpoints, logs): free space, free inodes, and how long a
// small write and fsync take. It warns before a checkpoint would fail, so
// someone can act while the job still runs. It never asks for a restart:
// restarting the workers frees no disk, and a disk that cannot be written
// is worth a loud warning, not a lost job.
package disk

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

// Detector is the disk detector. Configure's settings are kept behind an
// atomic pointer: the plugin server may call Watch from another goroutine
// than the one that called Configure.
type Detector struct {
	cfg atomic.Pointer[config]
}

// New returns an unconfigured disk detector.
func New() detector.Detector { return &Detector{} }

// Info describes the plugin and its options.
func (d *Detector) Info(context.Context) (plugins.Info, error) {
	return plugins.Info{
		Name:    "disk",
		Kind:    plugins.KindDetector,
		Version: version,
		Summary: "directories the job writes to: low space or inodes, slow or failing writes (warnings, never a restart)",
		Options: []plugins.Option{
			{Name: "paths", Required: true, Help: "comma list of directories to watch (checkpoints, logs); relative ones are taken from the plugin's working directory"},
			{Name: "interval", Default: defaultInterval, Help: "how often to check"},
			{Name: "min-free", Default: defaultMinFree, Help: "warn below this much free space: a size (500MB, 1GiB, bytes when bare) or a percent of the file system (5%); 0: no check"},
			{Name: "min-inodes", Default: defaultMinInodes, Help: "warn below this many free inodes: a count or a percent (1%); 0: no check"},
			{Name: "max-write-latency", Default: defaultMaxLatency, Help: "warn when writing and fsyncing a 4 KiB file (removed after) takes longer"},
			{Name: "timeout", Default: defaultTimeout, Help: "the longest one path's check may take; a hung one is a warning"},
		},
	}, nil
}

// Configure checks every option's value. The paths need not exist yet
// (the agent may make them later): a missing one is a finding, not an
// error.
func (d *Detector) Configure(_ context.Context, cfg plugins.Config) (detector.Schedule, error) {
	info, _ := d.Info(context.Background())
	if err := cfg.Check(info); err != nil {
		return detector.Schedule{}, err
	}
	c, err := parseConfig(cfg)
	if err != nil {
		return detector.Schedule{}, fmt.Errorf("plugin disk: %w", err)
	}
	d.cfg.Store(&c)
	// The paths are checked at once, so a check takes at most timeout.
	return detector.Schedule{Every: c.interval + c.timeout}, nil
}

// Watch checks every path each interval and emits one verdict per path,
// healthy or not, until ctx ends.
func (d *Detector) Watch(ctx context.Context, emit func(detector.Finding) error) error {
	c := d.cfg.Load()
	if c == nil {
		return errors.New("plugin disk: Watch before Configure")
	}
	w := newWatcher(*c, takeSample)
	return probe.Loop(ctx, c.interval, w.check, emit)
}
