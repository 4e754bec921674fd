package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"syscall"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/status"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// RefusedError is a plugin the agent will not run as configured: a
// missing binary, another protocol version, an unknown option, a value
// its Configure refused. At start it stops the agent before the job does;
// it is the user's to fix, so it is never retried.
type RefusedError struct {
	Plugin string
	Err    error
}

// Error quotes the name: a plugin named "plugin" read "plugin plugin
// refused".
func (e *RefusedError) Error() string { return fmt.Sprintf("plugin %q refused: %v", e.Plugin, e.Err) }
func (e *RefusedError) Unwrap() error { return e.Err }

// proc is one running plugin process and what it serves.
type proc struct {
	client *goplugin.Client
	cmd    *exec.Cmd
	stderr *stderrTail
	info   plugins.Info
	det    detector.Detector
	not    notifier.Notifier
}

// killGrace is how long a plugin gets to exit when asked (go-plugin's
// graceful Kill); then its process group is SIGKILLed.
const killGrace = 2 * time.Second

// kill stops the plugin: go-plugin's graceful Kill, bounded (it waits
// without limit for a frozen process), then SIGKILL to the plugin's
// process group, which takes what the plugin started in it too.
func (p *proc) kill() {
	if p == nil || p.client == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.client.Kill()
	}()
	select {
	case <-done:
	case <-time.After(killGrace):
	}
	if p.cmd != nil && p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // its own group (Setpgid): the pgid is its pid
	}
}

func (p *proc) exited() bool { return p == nil || p.client == nil || p.client.Exited() }

// exitedWithin reports whether the process exits within d: a broken
// stream is often seen before go-plugin has reaped the process.
func (p *proc) exitedWithin(d time.Duration) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if p.exited() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// exitedError says that the plugin exited, and how (its exit code, or
// the signal that ended it) once go-plugin has reaped it: "exit status
// 2" points at the plugin's own os.Exit, "signal: killed" at the OOM
// killer or a person.
func (p *proc) exitedError() error {
	// go-plugin sets Exited after cmd.Wait, under its lock: once p.exited
	// holds, ProcessState is written and safe to read.
	if p.exited() && p.cmd != nil && p.cmd.ProcessState != nil {
		return fmt.Errorf("the plugin exited (%s)", p.cmd.ProcessState)
	}
	return errors.New("the plugin exited")
}

// pluginSet is the agent's side of every plugin kind: go-plugin dispenses
// the one a plugin's Info names.
func pluginSet() goplugin.PluginSet {
	return goplugin.PluginSet{
		plugins.InfoName:             &plugins.InfoPlugin{},
		string(plugins.KindDetector): &detector.Plugin{},
		string(plugins.KindNotifier): &notifier.Plugin{},
	}
}

var versionRE = regexp.MustCompile(`incompatible API version with plugin\. Plugin version: (\d+)`)

// launch starts sp's process, reads its Info and dispenses its kind. The
// process gets SIGKILL when the agent dies (Pdeathsig; the SDK also
// watches its parent), and a process group of its own so that stopping it
// takes what it started.
func (h *Host) launch(ctx context.Context, sp Spec) (*proc, error) {
	path, args, err := sp.command(h.cfg.Dir)
	if err != nil {
		return nil, &RefusedError{Plugin: sp.Name, Err: err}
	}
	cmd := exec.Command(path, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	tail := newStderrTail()
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  plugins.Handshake(),
		Plugins:          pluginSet(),
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		Logger:           newHCLog(h.log, sp.Name),
		StartTimeout:     h.cfg.StartTimeout,
		Stderr:           tail, // go-plugin also logs each stderr line through Logger
		SyncStdout:       io.Discard,
		SyncStderr:       tail, // os.Stderr of a plugin served by go-plugin alone (the SDK's Serve writes it to fd 2)
	})
	p := &proc{client: client, cmd: cmd, stderr: tail}
	if err := h.connect(ctx, sp, p); err != nil {
		if !errors.Is(err, errStartAbandoned) { // an abandoned start kills its plugin itself
			p.kill()
		}
		return nil, tail.wrap(err)
	}
	return p, nil
}

// errStartAbandoned: the host closed while a plugin was starting.
var errStartAbandoned = errors.New("start abandoned: the agent is stopping")

// startClient is p's go-plugin start (the handshake), given up when ctx
// ends: go-plugin's has no context and holds the client's lock until its
// StartTimeout, and an agent whose job was over waited 10 s more for a
// plugin that never answered. The abandoned start kills its plugin once
// go-plugin returns.
func startClient(ctx context.Context, p *proc) (goplugin.ClientProtocol, error) {
	type started struct {
		rpc goplugin.ClientProtocol
		err error
	}
	ch := make(chan started, 1)
	go func() {
		rpc, err := p.client.Client()
		ch <- started{rpc, err}
	}()
	select {
	case s := <-ch:
		return s.rpc, s.err
	case <-ctx.Done():
		go func() {
			<-ch
			p.kill()
		}()
		return nil, errStartAbandoned
	}
}

func (h *Host) connect(ctx context.Context, sp Spec, p *proc) error {
	rpc, err := startClient(ctx, p)
	if errors.Is(err, errStartAbandoned) {
		return fmt.Errorf("plugin %s: %w", sp.Name, err)
	}
	if err != nil {
		if m := versionRE.FindStringSubmatch(err.Error()); m != nil {
			return &RefusedError{Plugin: sp.Name, Err: fmt.Errorf("it speaks plugin protocol %s, this ddp-agent speaks %d: rebuild it against this agent's plugins SDK", m[1], plugins.ProtocolVersion)}
		}
		return fmt.Errorf("plugin %s: start: %w", sp.Name, handshakeError(err))
	}
	raw, err := rpc.Dispense(plugins.InfoName)
	if err != nil {
		return fmt.Errorf("plugin %s: %w", sp.Name, err)
	}
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	defer cancel()
	info, err := raw.(plugins.Described).Info(cctx)
	if err != nil {
		return fmt.Errorf("plugin %s: Info: %w", sp.Name, err)
	}
	if sp.Path == "" && info.Name != sp.Name {
		return &RefusedError{Plugin: sp.Name, Err: fmt.Errorf("the binary serves %q", info.Name)}
	}
	p.info = info
	switch info.Kind {
	case plugins.KindDetector:
		raw, err = rpc.Dispense(string(plugins.KindDetector))
		if err == nil {
			p.det = raw.(detector.Detector)
		}
	case plugins.KindNotifier:
		raw, err = rpc.Dispense(string(plugins.KindNotifier))
		if err == nil {
			p.not = raw.(notifier.Notifier)
		}
	default:
		return &RefusedError{Plugin: sp.Name, Err: fmt.Errorf("unknown kind %q", info.Kind)}
	}
	if err != nil {
		return fmt.Errorf("plugin %s: %w", sp.Name, err)
	}
	return nil
}

// pluginsOwn reports whether err is the plugin's own answer (its code
// returned it), not a deadline or a broken connection: only that is a
// refusal.
func pluginsOwn(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	_, isStatus := status.FromError(err)
	return !isStatus
}

// configure passes sp's settings to a started plugin; a refusal is the
// user's.
func (h *Host) configure(ctx context.Context, sp Spec, p *proc) (detector.Schedule, error) {
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	defer cancel()
	var sched detector.Schedule
	var err error
	if p.det != nil {
		sched, err = p.det.Configure(cctx, sp.Config)
		if err == nil && sched.Every <= 0 {
			err = errors.New("Configure promised no schedule (Every must be above 0)")
		}
	} else {
		err = p.not.Configure(cctx, sp.Config)
	}
	if err != nil && pluginsOwn(err) && !p.exitedWithin(200*time.Millisecond) {
		return sched, &RefusedError{Plugin: sp.Name, Err: err}
	}
	if err != nil {
		return sched, fmt.Errorf("plugin %s: Configure: %w", sp.Name, err)
	}
	return sched, nil
}

// start launches and configures sp: the first time at the agent's start,
// and again after each crash or hang.
func (h *Host) start(ctx context.Context, sp Spec) (*proc, detector.Schedule, error) {
	p, err := h.launch(ctx, sp)
	if err != nil {
		return nil, detector.Schedule{}, err
	}
	if err := sp.Config.Check(p.info); err != nil {
		p.kill()
		return nil, detector.Schedule{}, &RefusedError{Plugin: sp.Name, Err: err}
	}
	sched, err := h.configure(ctx, sp, p)
	if err != nil {
		p.kill()
		return nil, sched, err
	}
	return p, sched, nil
}

// restartDelay is the backoff after the n-th failure in a row (n >= 1):
// 1 s, doubling, at most Config.MaxBackoff.
func restartDelay(n int, first, max time.Duration) time.Duration {
	d := first
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}
