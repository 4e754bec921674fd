package main

import (
	"context"
	"log/slog"
	"sync"
)

// tally counts the warnings and errors logged, by message, with one
// example error each: always, whether or not -v prints them.
type tally struct {
	mu sync.Mutex
	m  map[string]int
	ex map[string]string // one example error per message
}

func newTally() *tally { return &tally{m: map[string]int{}, ex: map[string]string{}} }

func (t *tally) add(msg, example string) { t.addN(msg, example, 1) }

func (t *tally) addN(msg, example string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m[msg] += n
	if _, ok := t.ex[msg]; !ok && example != "" {
		t.ex[msg] = example
	}
}

// counts returns copies of the counts and of the examples.
func (t *tally) counts() (map[string]int, map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := make(map[string]int, len(t.m))
	for k, v := range t.m {
		c[k] = v
	}
	ex := make(map[string]string, len(t.ex))
	for m, e := range t.ex {
		ex[m] = e
	}
	return c, ex
}

// countHandler counts the records of Warn and above by message (the
// agents' and the clients'), and passes every record to next when -v.
type countHandler struct {
	t     *tally
	who   string
	next  slog.Handler // nil: discard
	attrs []slog.Attr
}

func (h *countHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.next != nil
}

func (h *countHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		ex := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" || a.Key == "error" {
				ex = a.Value.String()
				return false
			}
			return true
		})
		h.t.add(h.who+" "+r.Level.String()+": "+r.Message, ex)
	}
	if h.next != nil {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h *countHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	if h.next != nil {
		c.next = h.next.WithAttrs(as)
	}
	return &c
}

func (h *countHandler) WithGroup(name string) slog.Handler {
	c := *h
	if h.next != nil {
		c.next = h.next.WithGroup(name)
	}
	return &c
}
