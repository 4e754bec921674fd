// Package exec is the bundled detector that runs a site's own health
// check: a command, through /bin/sh -c, every interval. Its exit code is
// the verdict (0 healthy, 1 warn, 2 restart the workers, 3 drain the
// node) and the first line of its output the message, so any script a
// site already has becomes a detector without writing Go.
package exec

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

const (
	version         = "0.1.0"
	defaultInterval = "30s"
	defaultTimeout  = "10s"
)

// check is the exec detector. The plugin server runs Configure and Watch
// on goroutines of its own, so the settings are behind a lock.
type check struct {
	mu  sync.Mutex
	set *settings // nil until Configure
}

// settings is what Configure decided.
type settings struct {
	command  string
	interval time.Duration
	timeout  time.Duration
}

// New returns an unconfigured exec detector.
func New() detector.Detector { return &check{} }

// Info describes the plugin and its options.
func (*check) Info(context.Context) (plugins.Info, error) {
	return info(), nil
}

func info() plugins.Info {
	return plugins.Info{
		Name:    "exec",
		Kind:    plugins.KindDetector,
		Version: version,
		Summary: "runs a site's health-check command; exit 0 healthy, 1 warn, 2 restart the workers, 3 drain the node",
		Options: []plugins.Option{
			{Name: "command", Required: true, Help: "the check, run with /bin/sh -c; the first line of its output is the message"},
			{Name: "interval", Default: defaultInterval, Help: "the wait between the end of a check and the start of the next"},
			{Name: "timeout", Default: defaultTimeout, Help: "a check running longer is a warning, killed with its process group"},
		},
	}
}

// Configure checks the options. The schedule is interval + timeout: the
// longest from one verdict to the next.
func (c *check) Configure(_ context.Context, cfg plugins.Config) (detector.Schedule, error) {
	if err := cfg.Check(info()); err != nil {
		return detector.Schedule{}, err
	}
	interval, err := positive(cfg, "interval", defaultInterval)
	if err != nil {
		return detector.Schedule{}, err
	}
	timeout, err := positive(cfg, "timeout", defaultTimeout)
	if err != nil {
		return detector.Schedule{}, err
	}
	c.mu.Lock()
	c.set = &settings{command: cfg["command"], interval: interval, timeout: timeout}
	c.mu.Unlock()
	return detector.Schedule{Every: interval + timeout}, nil
}

func positive(cfg plugins.Config, key, def string) (time.Duration, error) {
	v := cfg.Get(key, def)
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("plugin exec: option %s=%q: want a duration above 0, such as %s", key, v, def)
	}
	return d, nil
}

// Watch runs the command at once, then interval after each check ends,
// until ctx ends; a check in flight then is killed and not reported.
func (c *check) Watch(ctx context.Context, emit func(detector.Finding) error) error {
	c.mu.Lock()
	set := c.set
	c.mu.Unlock()
	if set == nil {
		return errors.New("plugin exec: Watch before Configure")
	}
	wait := time.NewTimer(0)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wait.C:
		}
		res := run(ctx, set.command, set.timeout)
		if ctx.Err() != nil {
			return nil
		}
		if err := emit(verdict(res, set.timeout)); err != nil {
			return err
		}
		wait.Reset(set.interval)
	}
}
