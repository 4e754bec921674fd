// Package webhook is the bundled notifier that POSTs each of the job's
// events, as one JSON object (payload.go), to a URL: a chat channel's
// incoming webhook, a pager, a site's own service. A secret signs each
// body (sign.go); network errors, 5xx and 429 are retried with backoff
// within the deadline the agent gives Notify (deliver.go).
package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// version is this plugin's own version, in its Info and User-Agent.
const version = "0.1.0"

// Notifier is the webhook notifier. Configure's settings are kept behind
// an atomic pointer: the plugin server may call Notify from another
// goroutine than the one that called Configure.
type Notifier struct {
	cfg         atomic.Pointer[config]
	client      *http.Client
	backoffBase time.Duration // the first retry's wait before jitter; tests shorten it
}

// New returns an unconfigured webhook notifier.
func New() notifier.Notifier {
	// A transport of its own: nothing else in the process shares (or
	// tunes) its connections.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return &Notifier{client: &http.Client{Transport: tr}, backoffBase: defaultBackoffBase}
}

// Info describes the plugin and its options.
func (n *Notifier) Info(context.Context) (plugins.Info, error) {
	return plugins.Info{
		Name:    "webhook",
		Kind:    plugins.KindNotifier,
		Version: version,
		Summary: "POSTs each job event as JSON (schema " + schemaName + ") to a URL, signed with HMAC-SHA256 when given a secret",
		Options: []plugins.Option{
			{Name: "url", Required: true, Help: "the http or https URL to POST to"},
			{Name: "secret", Help: "sign each POST: X-DDP-Agent-Signature: sha256=hex(HMAC-SHA256(secret, timestamp + \".\" + body))"},
			{Name: "timeout", Default: defaultTimeout, Help: "the longest one POST may take"},
			{Name: "retries", Default: defaultRetries, Help: "tries after the first on a network error, a 5xx or a 429 (0 to " + fmt.Sprint(maxRetries) + "), within the event's deadline"},
			{Name: "header", Help: `one more header to send, "Name: value" (e.g. "Authorization: Bearer TOKEN")`},
		},
	}, nil
}

// Configure checks every option's value.
func (n *Notifier) Configure(_ context.Context, cfg plugins.Config) error {
	info, _ := n.Info(context.Background())
	if err := cfg.Check(info); err != nil {
		return err
	}
	c, err := parseConfig(cfg)
	if err != nil {
		return fmt.Errorf("plugin webhook: %w", err)
	}
	n.cfg.Store(&c)
	return nil
}

// Notify POSTs one event, retrying as the options say, and returns when
// it is delivered, refused, or ctx's deadline leaves no time to retry.
func (n *Notifier) Notify(ctx context.Context, ev notifier.Event) error {
	c := n.cfg.Load()
	if c == nil {
		return errors.New("plugin webhook: Notify before Configure")
	}
	body, err := encodePayload(ev, time.Now())
	if err != nil {
		return fmt.Errorf("webhook: encode the %s event: %w", ev.Kind, err)
	}
	if err := n.deliver(ctx, c, string(ev.Kind), body); err != nil {
		return fmt.Errorf("webhook %s: %s event: %w", c.redacted, ev.Kind, err)
	}
	return nil
}
