package relay

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// Handler receives what the followers send, on the leader. The Server
// calls it from the requests' goroutines, concurrently for different
// nodes; a Client sends one request at a time, so calls for one node come
// one at a time unless a call outlasts the follower's 5 s wait for the
// answer (it then counts the batch as lost and goes on). A call should
// return promptly. The slices and the map passed belong to the callee.
type Handler interface {
	// Records are a batch of a node's records, times on the leader's clock.
	Records(node string, recs []telemetry.Record)
	// Workers describe a node's workers; sent once, and again when the
	// follower reconnects to a restarted leader or the workers change.
	Workers(node string, ws []telemetry.Worker)
	// Stacks are the Python stacks of a node's ranks, by global rank,
	// answering RequestStacks. Each text is at most MaxStack bytes.
	Stacks(node string, stacks map[int]string)
}

// Server is the leader's end of the relay. Its methods are safe for
// concurrent use.
type Server struct {
	h     Handler
	log   *slog.Logger
	token [sha256.Size]byte // of the job's secret: compared in constant time
	epoch string
	id    identity
	ln    net.Listener // the TCP listener, under TLS
	srv   *http.Server

	refused atomic.Uint64 // requests without the secret

	done   chan struct{} // closed by Close: long polls answer
	served chan struct{} // closed when Serve returns
	once   sync.Once
	err    error // of Close

	mu         sync.Mutex
	closing    bool
	active     int           // requests in progress past the guard
	idle       chan struct{} // closed when active drops to 0 while closing
	seq        uint64        // number of the newest hang request
	hangs      []hangEntry   // oldest first, at most maxHangs
	wake       chan struct{} // closed and replaced when a hang request is added
	nodes      map[string]*nodeState
	lastDenied time.Time // of the last warning about refused requests
	deniedAt   uint64    // the refused count it gave
}

type hangEntry struct {
	seq uint64
	at  time.Time
	h   telemetry.Hang
}

type nodeState struct {
	dropped  uint64 // the follower's dropped total, as it last said
	warned   uint64 // the total of the last warning
	lastWarn time.Time
}

// Listen starts the leader's relay on addr, which names one host (an IP
// address, as BindHost gives; port 0 picks a port: see Addr), never every
// interface, and serves HTTPS until Close with a self-signed certificate
// made now (see Fingerprint). Only requests that present token (see
// LeaderToken) reach h; log gets the connections and troubles (nil: no
// logging).
func Listen(addr, token string, h Handler, log *slog.Logger) (*Server, error) {
	return listenAs(addr, token, h, log, nil)
}

// listenAs is Listen with the certificate of id, or a new one when id is
// nil (tests: a leader restarted with the same certificate).
func listenAs(addr, token string, h Handler, log *slog.Logger, id *identity) (*Server, error) {
	if token == "" {
		return nil, errors.New("relay: listen: empty token")
	}
	if h == nil {
		return nil, errors.New("relay: listen: nil handler")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("relay: listen on %s: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return nil, fmt.Errorf("relay: listen on %q: every interface; want the address the agents use", addr)
	}
	if id == nil {
		nid, err := newIdentity(host, time.Now())
		if err != nil {
			return nil, err
		}
		id = &nid
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("relay: listen on %s: %w", addr, err)
	}
	var e [8]byte
	rand.Read(e[:]) // never fails (crypto/rand)
	s := &Server{
		h: h, log: log, token: sha256.Sum256([]byte(token)), epoch: hex.EncodeToString(e[:]), id: *id, ln: ln,
		done: make(chan struct{}), served: make(chan struct{}), wake: make(chan struct{}), nodes: map[string]*nodeState{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+pathTime, s.handleTime)
	mux.HandleFunc("POST "+pathRecs, s.handleRecords)
	mux.HandleFunc("POST "+pathWork, s.handleWorkers)
	mux.HandleFunc("POST "+pathStacks, s.handleStacks)
	mux.HandleFunc("GET "+pathHangs, s.handleHangs)
	s.srv = &http.Server{
		Handler:           s.guard(mux),
		ReadHeaderTimeout: 10 * time.Second, // the TLS handshake included
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      maxPollWait + 15*time.Second, // a long poll writes at its end
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		TLSConfig:         serverTLS(s.id),
		// Failed handshakes (plain HTTP, a stranger, a follower pinning
		// another certificate) land here: at debug, so that they cannot
		// flood the log.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	go func() {
		defer close(s.served)
		// Serve on a TLS listener: net/http answers a plain HTTP request
		// with a 400 and closes, and no handler runs.
		if err := s.srv.Serve(tls.NewListener(ln, s.srv.TLSConfig)); !errors.Is(err, http.ErrServerClosed) {
			log.Error("relay: serve", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return s, nil
}

// Addr is the address the Server listens on, such as "10.0.0.1:41234".
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Fingerprint is the hex SHA-256 of the Server's certificate, for the
// followers to pin (ClientConfig.Fingerprint).
func (s *Server) Fingerprint() string { return s.id.fingerprint }

// Refused counts the requests refused for want of the secret.
func (s *Server) Refused() uint64 { return s.refused.Load() }

// RequestStacks asks every follower for the Python stacks of its ranks
// because of hang h: the followers' long polls get it at once, and those
// that poll later within two minutes get it then. A hang key is asked
// for once; asking again for it does nothing. It does not wait for the
// answers, which come to the Handler's Stacks.
func (s *Server) RequestStacks(h telemetry.Hang) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return
	}
	for _, e := range s.hangs {
		if e.h.Key == h.Key {
			return
		}
	}
	h.Waiting, h.Missing = slices.Clone(h.Waiting), slices.Clone(h.Missing)
	s.seq++
	s.hangs = append(s.hangs, hangEntry{seq: s.seq, at: time.Now(), h: h})
	if len(s.hangs) > maxHangs {
		s.hangs = slices.Delete(s.hangs, 0, len(s.hangs)-maxHangs)
	}
	close(s.wake)
	s.wake = make(chan struct{})
	s.log.Debug("relay: asking the followers for stacks", "hang", h.Key.String(), "missing", h.Missing)
}

// Close stops the Server: long polls are answered, new requests refused,
// and requests in progress (with the Handler calls they make) get up to
// 2 s to finish before every connection is closed. The Handler is not
// called after Close returns unless a call outlasted that. Close is
// idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closing = true
		close(s.done)
		var idle chan struct{}
		if s.active > 0 {
			idle = make(chan struct{})
			s.idle = idle
		}
		s.mu.Unlock()
		s.srv.SetKeepAlivesEnabled(false)
		if idle != nil {
			t := time.NewTimer(closeWait)
			select {
			case <-idle:
			case <-t.C:
				s.log.Warn("relay: closing with requests still in progress", "wait", closeWait)
			}
			t.Stop()
		}
		s.err = s.srv.Close()
		<-s.served
	})
	return s.err
}

// guard authenticates every request before anything else looks at it,
// refuses requests once the Server is closing, and counts those in
// progress for Close.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			s.denied(r)
			w.Header().Set("WWW-Authenticate", `Bearer realm="ddp-agent relay"`)
			http.Error(w, "relay: the job's secret is missing or wrong", http.StatusUnauthorized)
			return
		}
		w.Header().Set(hdrEpoch, s.epoch)
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			http.Error(w, "relay: the leader is closing", http.StatusServiceUnavailable)
			return
		}
		s.active++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.active--
			if s.active == 0 && s.idle != nil {
				close(s.idle)
				s.idle = nil
			}
			s.mu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}

func (s *Server) authorized(r *http.Request) bool {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	// Hashing first makes the comparison's time independent of the length too.
	sum := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(sum[:], s.token[:]) == 1
}

// denied counts a refused request and logs it: a warning at most every
// warnEvery, with the count since the last one, so that a stranger cannot
// flood the log; at debug otherwise.
func (s *Server) denied(r *http.Request) {
	n := s.refused.Add(1)
	s.mu.Lock()
	warn := time.Since(s.lastDenied) >= warnEvery
	since := n - s.deniedAt
	if warn {
		s.lastDenied, s.deniedAt = time.Now(), n
	}
	s.mu.Unlock()
	lvl := slog.LevelDebug
	if warn {
		lvl = slog.LevelWarn
	}
	s.log.Log(r.Context(), lvl, "relay: refused a request without the job's secret", "remote", r.RemoteAddr,
		"node", r.Header.Get(hdrNode), "path", r.URL.Path, "refused", n, "since_last_warning", since)
}

// node is the sending node's name from its header, or a 400.
func (s *Server) node(w http.ResponseWriter, r *http.Request) (string, bool) {
	node := r.Header.Get(hdrNode)
	if !validNode(node) {
		http.Error(w, "relay: missing or invalid "+hdrNode+" header", http.StatusBadRequest)
		return "", false
	}
	return node, true
}

// body reads the request body up to limit bytes, or answers 413 (too
// large) or 400 (cut short).
func body(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	if r.ContentLength > limit {
		http.Error(w, fmt.Sprintf("relay: body of %d bytes over the limit of %d", r.ContentLength, limit), http.StatusRequestEntityTooLarge)
		return nil, false
	}
	buf := make([]byte, 0, max(r.ContentLength, 512))
	b, err := readAll(http.MaxBytesReader(w, r.Body, limit), buf)
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			http.Error(w, fmt.Sprintf("relay: body over the limit of %d bytes", limit), http.StatusRequestEntityTooLarge)
		} else {
			http.Error(w, "relay: read body: "+err.Error(), http.StatusBadRequest)
		}
		return nil, false
	}
	return b, true
}

// readAll is io.ReadAll into buf.
func readAll(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

func badRequest(w http.ResponseWriter, err error) {
	http.Error(w, "relay: "+err.Error(), http.StatusBadRequest)
}

func (s *Server) handleTime(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", ctJSON)
	w.Header().Set("Cache-Control", "no-store")
	b, _ := json.Marshal(timeMsg{UnixNano: time.Now().UnixNano()}) // as late as can be
	w.Write(b)
}

func (s *Server) handleRecords(w http.ResponseWriter, r *http.Request) {
	node, ok := s.node(w, r)
	if !ok {
		return
	}
	b, ok := body(w, r, min(MaxBody, recordsHeader+MaxBatch*recordSize))
	if !ok {
		return
	}
	recs, dropped, err := decodeRecords(b)
	if err != nil {
		badRequest(w, err)
		return
	}
	s.seen(node, r.RemoteAddr, dropped)
	if len(recs) > 0 {
		s.h.Records(node, recs)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleWorkers(w http.ResponseWriter, r *http.Request) {
	node, ok := s.node(w, r)
	if !ok {
		return
	}
	b, ok := body(w, r, MaxBody)
	if !ok {
		return
	}
	ws, err := decodeWorkers(b)
	if err != nil {
		badRequest(w, err)
		return
	}
	s.seen(node, r.RemoteAddr, 0)
	s.h.Workers(node, ws)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleStacks(w http.ResponseWriter, r *http.Request) {
	node, ok := s.node(w, r)
	if !ok {
		return
	}
	b, ok := body(w, r, MaxBody)
	if !ok {
		return
	}
	stacks, err := decodeStacks(b)
	if err != nil {
		badRequest(w, err)
		return
	}
	s.seen(node, r.RemoteAddr, 0)
	s.h.Stacks(node, stacks)
	w.WriteHeader(http.StatusNoContent)
}

// handleHangs answers a long poll: the hang requests numbered above
// after, or after waiting up to wait for one, an empty list.
func (s *Server) handleHangs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var after uint64
	if a := q.Get("after"); a != "" {
		var err error
		if after, err = strconv.ParseUint(a, 10, 64); err != nil {
			badRequest(w, fmt.Errorf("after: %w", err))
			return
		}
	}
	var wait time.Duration
	if ws := q.Get("wait"); ws != "" {
		var err error
		if wait, err = time.ParseDuration(ws); err != nil || wait < 0 {
			badRequest(w, fmt.Errorf("wait %q: not a duration", ws))
			return
		}
	}
	wait = min(wait, maxPollWait)
	if q.Get("epoch") != s.epoch {
		// A follower of a previous leader on this address: it gets all
		// the requests and, at once, the new epoch (its workers are
		// missing here).
		after, wait = 0, 0
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		s.mu.Lock()
		m := hangsMsg{Epoch: s.epoch, Seq: s.seq, Hangs: []hangJSON{}}
		now := time.Now()
		for _, e := range s.hangs {
			if e.seq > after && now.Sub(e.at) < hangTTL {
				m.Hangs = append(m.Hangs, hangToJSON(e.h))
			}
		}
		wake := s.wake
		s.mu.Unlock()
		if len(m.Hangs) == 0 {
			select {
			case <-wake:
				continue
			case <-r.Context().Done():
				return
			case <-t.C:
			case <-s.done:
			}
		}
		w.Header().Set("Content-Type", ctJSON)
		b, _ := json.Marshal(m)
		w.Write(b)
		return
	}
}

// seen notes a request of node: the first is logged, and so is a growing
// count of the records the follower had to drop.
func (s *Server) seen(node, remote string, dropped uint64) {
	s.mu.Lock()
	ns, old := s.nodes[node]
	if !old {
		ns = &nodeState{}
		s.nodes[node] = ns
	}
	ns.dropped = max(ns.dropped, dropped)
	warn := ns.dropped > ns.warned && time.Since(ns.lastWarn) >= warnEvery
	if warn {
		ns.warned, ns.lastWarn = ns.dropped, time.Now()
	}
	total := ns.dropped
	s.mu.Unlock()
	if !old {
		s.log.Info("relay: follower connected", "node", node, "remote", remote)
	}
	if warn {
		s.log.Warn("relay: a follower dropped records (the leader was slow or unreachable): the analysis misses some of its collectives",
			"node", node, "dropped", total)
	}
}
