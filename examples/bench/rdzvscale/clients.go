package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// dialClients dials k clients of the store, 32 at a time, before the clock
// starts (a real agent dials before it opens the rendezvous). Each client
// is given every member's endpoint, as an agent given a cluster is. It
// returns every client it got, also with an error: the caller closes them.
func dialClients(ctx context.Context, timeout time.Duration, endpoints []string, k int, log *slog.Logger) ([]*etcdClient, error) {
	clis := make([]*etcdClient, k)
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	errs := make([]error, k)
	for i := range clis {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			clis[i], errs[i] = store.Dial(dctx, store.ClientConfig{Endpoints: endpoints, Logger: log})
		}()
	}
	wg.Wait()
	return clis, errors.Join(errs...)
}

func closeClients(clis []*etcdClient) {
	for _, c := range clis {
		if c != nil {
			c.Close()
		}
	}
}
