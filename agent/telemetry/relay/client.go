package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// ClientConfig configures a follower's Client.
type ClientConfig struct {
	Addr        string // the leader's relay, host:port (Endpoint.Addr)
	Fingerprint string // of the leader's certificate, the one trusted (Endpoint.Fingerprint)
	Node        string // this node's name on the leader (in its logs and Handler calls): printable ASCII, at most 256 bytes
	Token       string // the job's secret (FollowerToken)
	Log         *slog.Logger

	Now         func() time.Time // this node's clock; default time.Now (tests: a skewed clock)
	SyncEvery   time.Duration    // how often the clock offset is estimated again; default 30 s
	FlushEvery  time.Duration    // how often buffered records are sent; default 200 ms
	MaxBuffered int              // records buffered at most while the leader is slow or away; default 65536
}

// Timing of a Client.
const (
	samples     = 8                      // time requests per clock sync; the one with the smallest round trip counts
	syncTimeout = 2 * time.Second        // one time request
	postTimeout = 5 * time.Second        // one batch of records, workers or stacks
	pollWait    = 25 * time.Second       // how long the leader holds a hangs poll
	closeFlush  = time.Second            // what Close gives the last batches
	backoffMin  = 100 * time.Millisecond // first wait after a failed poll or Dial attempt
	backoffMax  = 2 * time.Second
	sendBatch   = 8192 // records per request, well within MaxBatch
	seenKeys    = 256  // hang keys a Client remembers, to hand each out once
)

// Client is a follower's end of the relay: it keeps the estimate of the
// offset between its clock and the leader's, and sends records, workers
// and stacks from one goroutine, polls for hang requests from another,
// and syncs the clock from a third. Its methods are safe for concurrent
// use.
type Client struct {
	cfg  ClientConfig
	log  *slog.Logger
	base string // https://addr
	tr   *http.Transport
	hc   *http.Client

	offset  atomic.Int64 // leader − follower, ns
	dropped atomic.Uint64

	hangs    chan telemetry.Hang
	kick     chan struct{} // workers or stacks to send now
	resync   chan struct{} // sync the clock now
	closing  chan struct{} // closed by Close: last flush
	sendDone chan struct{}
	ctx      context.Context // of the goroutines; cancelled by Close
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once

	mu          sync.Mutex
	closed      bool
	buf         []telemetry.Record // on the leader's clock, oldest first
	workers     []telemetry.Worker
	workersV    uint64 // version of workers, counting SendWorkers calls
	workersSent uint64 // the version the leader has; 0 after it restarted
	stacks      map[int]string
	epoch       string // of the leader, from its last answer

	// The sender goroutine's own (and Close's, once it has ended).
	pending   []byte // a records batch that could not reach the leader, sent first
	pendingN  int
	warnedAt  time.Time
	warnedFor uint64

	// The clock sync's own (Dial's, then syncLoop's).
	infoOff    time.Duration // the offset last logged at info
	loggedInfo bool
}

// Dial connects a follower to the leader at cfg.Addr over TLS, trusting
// only the certificate of cfg.Fingerprint: it estimates the clocks'
// offset, retrying while the leader cannot be reached, and returns once
// it has, or with an error when ctx ends first, the leader refuses the
// secret (ErrUnauthorized) or shows another certificate (ErrFingerprint).
// ctx bounds only Dial; the Client runs until Close.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return nil, fmt.Errorf("relay: leader address %q: %w", cfg.Addr, err)
	}
	if !isHex(cfg.Fingerprint, 2*32) {
		return nil, fmt.Errorf("relay: leader's certificate fingerprint %q: want 64 lowercase hex digits", cfg.Fingerprint)
	}
	if !validNode(cfg.Node) {
		return nil, fmt.Errorf("relay: node name %q: want 1 to %d bytes of printable ASCII", cfg.Node, maxNode)
	}
	if cfg.Token == "" {
		return nil, errors.New("relay: empty token")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SyncEvery <= 0 {
		cfg.SyncEvery = 30 * time.Second
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = 200 * time.Millisecond
	}
	if cfg.MaxBuffered <= 0 {
		cfg.MaxBuffered = 65536
	}
	tr := &http.Transport{
		Proxy:               nil, // the leader is on the job's network, never behind $HTTP_PROXY
		DialContext:         (&net.Dialer{Timeout: syncTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     pinnedTLS(cfg.Fingerprint),
		TLSHandshakeTimeout: syncTimeout,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	c := &Client{
		cfg: cfg, log: cfg.Log.With("leader", cfg.Addr), base: "https://" + cfg.Addr, tr: tr, hc: &http.Client{Transport: tr},
		hangs: make(chan telemetry.Hang, 8), kick: make(chan struct{}, 1), resync: make(chan struct{}, 1),
		closing: make(chan struct{}), sendDone: make(chan struct{}),
	}
	var lastErr error
	for backoff := backoffMin; ; backoff = min(2*backoff, time.Second) {
		err := c.syncClock(ctx)
		if err == nil {
			break
		}
		lastErr = err
		if errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrFingerprint) { // retrying would not change it
			tr.CloseIdleConnections()
			return nil, fmt.Errorf("relay: dial leader %s as %s: %w", cfg.Addr, cfg.Node, err)
		}
		t := time.NewTimer(jitter(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			tr.CloseIdleConnections()
			return nil, fmt.Errorf("relay: dial leader %s: %w (last: %w)", cfg.Addr, ctx.Err(), lastErr)
		case <-t.C:
		}
	}
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	c.wg.Add(3)
	go c.sendLoop()
	go c.pollLoop()
	go c.syncLoop()
	return c, nil
}

// Offset is the estimated offset of the leader's clock from this node's
// (leader − follower): a time t on this node is t + Offset on the leader.
func (c *Client) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// Dropped counts the records lost: dropped because the buffer was full,
// refused or unanswered by the leader, sent after Close, or still
// buffered when Close gave up.
func (c *Client) Dropped() uint64 { return c.dropped.Load() }

// Hangs delivers the leader's requests for stacks, each hang key once,
// with Since on this node's clock. It is closed when Close returns. The
// Client waits for the receiver, holding back later requests.
func (c *Client) Hangs() <-chan telemetry.Hang { return c.hangs }

// Send queues records for the leader, converting their times to the
// leader's clock with the current offset (zero times stay zero). It never
// waits: when MaxBuffered records are queued, the oldest are dropped and
// counted, and so are records with a rank outside [0, MaxInt32]. The
// Client does not keep recs.
func (c *Client) Send(recs []telemetry.Record) {
	if len(recs) == 0 {
		return
	}
	off := c.Offset()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.dropped.Add(uint64(len(recs)))
		return
	}
	var lost int
	if extra := len(recs) - c.cfg.MaxBuffered; extra > 0 { // more than fit: the newest are kept
		lost, recs = extra, recs[extra:]
	}
	for _, r := range recs {
		if !validRank(r.Rank) {
			lost++
			continue
		}
		r.Arrive, r.Start, r.End = shift(r.Arrive, off), shift(r.Start, off), shift(r.End, off)
		c.buf = append(c.buf, r)
	}
	if extra := len(c.buf) - c.cfg.MaxBuffered; extra > 0 {
		lost += extra
		c.buf = c.buf[extra:]
	}
	if lost > 0 {
		c.dropped.Add(uint64(lost))
	}
}

// SendWorkers tells the leader this node's workers: at once, again until
// the leader has them, and again after the leader restarted. It does not
// wait; a later call replaces what an earlier one sent.
func (c *Client) SendWorkers(ws []telemetry.Worker) {
	ws = append([]telemetry.Worker(nil), ws...)
	c.mu.Lock()
	c.workers = ws
	c.workersV++
	c.mu.Unlock()
	c.poke(c.kick)
}

// SendStacks sends the Python stacks of ranks (by global rank) to the
// leader at once, retrying until it has them; each text is cut to
// MaxStack bytes. It does not wait; a later stack of a rank not yet sent
// replaces the earlier one.
func (c *Client) SendStacks(stacks map[int]string) {
	c.mu.Lock()
	if c.stacks == nil {
		c.stacks = map[int]string{}
	}
	for r, s := range stacks {
		if validRank(r) {
			c.stacks[r] = truncStack(s)
		}
	}
	c.mu.Unlock()
	c.poke(c.kick)
}

// Close stops the Client: it gives the records, workers and stacks still
// queued up to 1 s to reach the leader, counts the records left as
// dropped, stops the goroutines and closes Hangs. It returns within about
// a second, and is idempotent.
func (c *Client) Close() {
	c.once.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		close(c.closing)
		t := time.NewTimer(closeFlush)
		select {
		case <-c.sendDone:
		case <-t.C:
		}
		t.Stop()
		c.cancel()
		c.wg.Wait()
		close(c.hangs)
		c.mu.Lock()
		lost := len(c.buf) + c.pendingN // the sender has ended: pending is ours
		c.buf, c.pending, c.pendingN = nil, nil, 0
		c.mu.Unlock()
		c.dropped.Add(uint64(lost))
		c.tr.CloseIdleConnections()
		if d := c.dropped.Load(); d > 0 {
			c.log.Info("relay: closed; records dropped in all", "dropped", d)
		}
	})
}

func (c *Client) poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// jitter is d ± 20 %.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()-0.5)*0.4*float64(d))
}

// request makes one request to the leader, bounded by timeout, and
// returns the answer's status and body (at most MaxBody bytes). A 401 is
// ErrUnauthorized.
func (c *Client) request(ctx context.Context, timeout time.Duration, method, path, ctype string, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	req.Header.Set(hdrNode, c.cfg.Node)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	c.noteEpoch(resp.Header.Get(hdrEpoch))
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("read the answer to %s %s: %w", method, path, err)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return resp.StatusCode, nil, ErrUnauthorized
	case resp.StatusCode >= 300:
		return resp.StatusCode, nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b[:min(len(b), 200)]))
	}
	return resp.StatusCode, b, nil
}

// noteEpoch notes the leader's epoch; a new one means a restarted leader,
// which needs the workers again and may run on another clock.
func (c *Client) noteEpoch(e string) {
	if e == "" {
		return
	}
	c.mu.Lock()
	changed := c.epoch != "" && c.epoch != e
	c.epoch = e
	if changed {
		c.workersSent = 0
	}
	c.mu.Unlock()
	if changed {
		c.log.Info("relay: the leader restarted; sending the workers again")
		c.poke(c.kick)
		c.poke(c.resync)
	}
}

// syncClock estimates the offset from up to samples time requests and
// keeps the one with the smallest round trip (Cristian's algorithm: the
// leader read its clock about halfway through). It fails only when no
// request succeeded.
func (c *Client) syncClock(ctx context.Context) error {
	var best struct{ off, rtt time.Duration }
	var n int
	var lastErr error
	for range samples {
		t0 := c.cfg.Now()
		status, b, err := c.request(ctx, syncTimeout, http.MethodGet, pathTime, "", nil)
		t1 := c.cfg.Now()
		if err != nil {
			lastErr = err
			break
		}
		var m timeMsg
		if err := json.Unmarshal(b, &m); err != nil || status != http.StatusOK {
			lastErr = fmt.Errorf("time from the leader: status %d: %q", status, b[:min(len(b), 100)])
			break
		}
		rtt := t1.Sub(t0)
		if rtt < 0 { // this node's clock stepped back meanwhile
			continue
		}
		off := time.Unix(0, m.UnixNano).Sub(t0.Add(rtt / 2))
		if n == 0 || rtt < best.rtt {
			best.off, best.rtt = off, rtt
		}
		n++
	}
	if n == 0 {
		if lastErr == nil {
			lastErr = errors.New("this node's clock went back during every time request")
		}
		return fmt.Errorf("sync clock: %w", lastErr)
	}
	c.offset.Store(int64(best.off))
	lvl := slog.LevelDebug
	if abs(best.off) > 10*time.Millisecond && (!c.loggedInfo || abs(best.off-c.infoOff) > 10*time.Millisecond) {
		lvl, c.infoOff, c.loggedInfo = slog.LevelInfo, best.off, true // at info when large, and again when it moved
	}
	c.log.Log(ctx, lvl, "relay: clock offset to the leader", "offset", best.off, "bound", best.rtt/2, "samples", n)
	return nil
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func (c *Client) syncLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.SyncEvery)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		case <-c.resync:
		}
		if err := c.syncClock(c.ctx); err != nil && c.ctx.Err() == nil {
			c.log.Debug("relay: clock sync failed; keeping the last offset", "offset", c.Offset(), "err", err)
		}
	}
}

// sendLoop sends what is queued every FlushEvery, and workers and stacks
// as soon as they come; when Close begins it flushes once more.
func (c *Client) sendLoop() {
	defer c.wg.Done()
	defer close(c.sendDone)
	t := time.NewTicker(c.cfg.FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-c.closing:
			c.flush(c.ctx)
			return
		case <-t.C:
		case <-c.kick:
		}
		c.flush(c.ctx)
	}
}

// flush sends the workers if the leader lacks them, the stacks queued,
// then the records queued in batches, until none is left or one fails.
func (c *Client) flush(ctx context.Context) {
	c.mu.Lock()
	ws, v := c.workers, c.workersV
	need := ws != nil && c.workersSent != v
	c.mu.Unlock()
	if need {
		if b, err := encodeWorkers(ws); err == nil {
			if _, _, err := c.request(ctx, postTimeout, http.MethodPost, pathWork, ctJSON, b); err != nil {
				c.log.Debug("relay: send workers", "err", err)
			} else {
				c.mu.Lock()
				if c.workersV == v {
					c.workersSent = v
				}
				c.mu.Unlock()
			}
		}
	}

	c.mu.Lock()
	stacks := c.stacks
	c.stacks = nil
	c.mu.Unlock()
	if len(stacks) > 0 {
		b, _ := json.Marshal(stacksMsg{Stacks: stacks})
		if _, _, err := c.request(ctx, postTimeout, http.MethodPost, pathStacks, ctJSON, b); err != nil {
			c.log.Warn("relay: send stacks; retrying", "ranks", len(stacks), "err", err)
			c.mu.Lock()
			if c.stacks != nil { // newer ones win
				maps.Copy(stacks, c.stacks)
			}
			c.stacks = stacks
			c.mu.Unlock()
		}
	}

	c.flushRecords(ctx)

	if d := c.dropped.Load(); d > c.warnedFor && time.Since(c.warnedAt) >= warnEvery {
		c.log.Warn("relay: records dropped: the leader is slow or unreachable, or the buffer is full", "dropped", d, "new", d-c.warnedFor)
		c.warnedFor, c.warnedAt = d, time.Now()
	}
}

func (c *Client) flushRecords(ctx context.Context) {
	for ctx.Err() == nil {
		if c.pending == nil {
			c.mu.Lock()
			n := min(len(c.buf), sendBatch)
			batch := c.buf[:n:n] // Send only appends past it, so it stays ours
			c.buf = c.buf[n:]
			if len(c.buf) == 0 {
				c.buf = nil
			}
			c.mu.Unlock()
			if n == 0 {
				return
			}
			// A new buffer each time: the transport may read a body after Do returns.
			c.pending, c.pendingN = appendRecords(make([]byte, 0, recordsHeader+n*recordSize), batch, c.dropped.Load()), n
		}
		status, _, err := c.request(ctx, postTimeout, http.MethodPost, pathRecs, ctRecords, c.pending)
		if err != nil && (undelivered(err) || status == http.StatusServiceUnavailable) {
			// The leader never saw it: keep it for the next try.
			c.log.Debug("relay: send records; will retry", "records", c.pendingN, "err", err)
			return
		}
		if err != nil { // refused, or sent and not answered: resending could duplicate it
			c.dropped.Add(uint64(c.pendingN))
			c.log.Debug("relay: send records; dropped", "records", c.pendingN, "err", err)
		}
		c.pending, c.pendingN = nil, 0
		if err != nil {
			return
		}
	}
}

// undelivered reports whether a request failed before reaching the
// leader: it could not connect, or the one at the address is not the
// leader (its certificate is another).
func undelivered(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" || errors.Is(err, ErrFingerprint)
}

// pollLoop long-polls the leader for hang requests, reconnecting with
// backoff, and hands each hang key out once.
func (c *Client) pollLoop() {
	defer c.wg.Done()
	var after uint64
	seen := map[telemetry.Key]bool{}
	var order []telemetry.Key
	backoff, lost := backoffMin, false
	for c.ctx.Err() == nil {
		m, err := c.poll(after)
		if c.ctx.Err() != nil {
			return
		}
		if err != nil {
			if !lost {
				c.log.Warn("relay: lost the leader; reconnecting", "err", err)
				lost = true
			}
			t := time.NewTimer(jitter(backoff))
			select {
			case <-c.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, backoffMax)
			continue
		}
		if lost {
			c.log.Info("relay: reached the leader again")
			lost = false
		}
		backoff, after = backoffMin, m.Seq
		for _, j := range m.Hangs {
			h := hangFromJSON(j)
			if seen[h.Key] {
				continue
			}
			seen[h.Key] = true
			if order = append(order, h.Key); len(order) > seenKeys {
				delete(seen, order[0])
				order = order[1:]
			}
			h.Since = shift(h.Since, -c.Offset())
			select {
			case c.hangs <- h:
			case <-c.ctx.Done():
				return
			}
		}
	}
}

func (c *Client) poll(after uint64) (hangsMsg, error) {
	c.mu.Lock()
	epoch := c.epoch
	c.mu.Unlock()
	q := url.Values{"epoch": {epoch}, "after": {strconv.FormatUint(after, 10)}, "wait": {pollWait.String()}}
	_, b, err := c.request(c.ctx, pollWait+10*time.Second, http.MethodGet, pathHangs+"?"+q.Encode(), "", nil)
	if err != nil {
		return hangsMsg{}, err
	}
	var m hangsMsg
	if err := json.Unmarshal(b, &m); err != nil {
		return hangsMsg{}, fmt.Errorf("hang requests from the leader: %w", err)
	}
	return m, nil
}
