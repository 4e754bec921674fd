package webhook

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// maxErrorBody is how much of a refusal's body an error quotes.
const maxErrorBody = 200

// try is how one POST went.
type try struct {
	err        error         // nil: delivered
	retry      bool          // worth another try
	retryAfter time.Duration // the endpoint's Retry-After; valid when hasAfter
	hasAfter   bool
}

// deliver POSTs body until it is delivered, refused, out of retries, or
// the next wait would end past ctx's deadline: then it gives up at once
// rather than sleep into a deadline it cannot meet.
func (n *Notifier) deliver(ctx context.Context, c *config, kind string, body []byte) error {
	id := deliveryID()
	for i := 0; ; i++ {
		t := n.post(ctx, c, kind, id, body)
		if t.err == nil {
			return nil
		}
		if !t.retry || ctx.Err() != nil {
			return t.err
		}
		if i == c.retries {
			return fmt.Errorf("gave up after %d tries: %w", i+1, t.err)
		}
		wait := backoff(i, rand.Float64(), n.backoffBase)
		if t.hasAfter {
			wait = t.retryAfter
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return fmt.Errorf("%w; no retry: the next try, in %s, would be past the deadline", t.err, wait.Round(time.Millisecond))
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w; no retry: %w", t.err, ctx.Err())
		case <-timer.C:
		}
	}
}

// post makes one try, within the timeout option and ctx.
func (n *Notifier) post(ctx context.Context, c *config, kind, id string, body []byte) try {
	tctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(tctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return try{err: fmt.Errorf("make the request: %w", err)}
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10) // each try anew: receivers refuse stale ones
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "ddp-agent-webhook/"+version)
	req.Header.Set(hdrEvent, kind)
	req.Header.Set(hdrDelivery, id)
	req.Header.Set(hdrTimestamp, ts)
	if c.secret != "" {
		req.Header.Set(hdrSignature, "sha256="+sign(c.secret, ts, body))
	}
	if c.header[0] != "" {
		req.Header.Set(c.header[0], c.header[1])
	}
	resp, err := n.client.Do(req)
	if err != nil {
		if ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded) {
			return try{err: fmt.Errorf("POST: no answer within the timeout, %s", c.timeout), retry: true}
		}
		return try{err: fmt.Errorf("POST: %w", bareError(err)), retry: true}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so the connection is reused
		return try{}
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	t := try{err: fmt.Errorf("POST: %s: %q", resp.Status, snippet), retry: retryable(resp.StatusCode)}
	t.retryAfter, t.hasAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
	return t
}

// bareError drops net/http's "Post \"URL\":" wrapper, which quotes the
// whole URL: a chat webhook's path is its secret, and errors are logged.
func bareError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// deliveryID is a random id for one event's tries.
func deliveryID() string {
	b := make([]byte, 16)
	_, _ = crand.Read(b) // crypto/rand.Read does not fail on Linux
	return hex.EncodeToString(b)
}
