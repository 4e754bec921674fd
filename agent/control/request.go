package control

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ddp-agent/ddp-agent/wire"
)

// request serves one KVSet or KVGet and sends the reply. A KVSet arrives
// charged to the rank's quota (admit); it is refunded when the store
// certainly did not take the value.
func (c *serverConn) request(ctx context.Context, id uint32, m wire.Message) {
	var (
		op, key string
		reply   wire.Message = wire.OK{}
		err     error
	)
	switch m := m.(type) {
	case wire.KVSet:
		op, key = "kv set", m.Key
		if key != "" {
			sctx, cancel := context.WithTimeout(ctx, kvSetTimeout)
			err = c.s.cfg.KV.Set(sctx, c.scope(key), m.Value)
			cancel()
			if !mayHaveStored(err) {
				c.s.quota.refund(c.gen, c.rank, int64(len(key)+len(m.Value)))
			}
		}
	case wire.KVGet:
		op, key = "kv get", m.Key
		timeout := min(time.Duration(m.TimeoutMillis)*time.Millisecond, wire.MaxKVGetTimeout)
		if timeout == 0 {
			timeout = DefaultKVGetTimeout
		}
		if key != "" {
			gctx, cancel := context.WithTimeout(ctx, timeout)
			var v []byte
			v, err = c.s.cfg.KV.Get(gctx, c.scope(key))
			cancel()
			reply = wire.KVValue{Value: v}
		}
	}
	switch {
	case ctx.Err() != nil:
		return // connection closing; nobody to answer
	case key == "":
		reply = wire.Error{Code: wire.CodeBadRequest, Message: op + ": empty key"}
	case errors.Is(err, context.DeadlineExceeded):
		reply = wire.Error{Code: wire.CodeTimeout, Message: fmt.Sprintf("%s %q: %v", op, key, err)}
	case err != nil:
		c.log.Warn("control request", "op", op, "key", key, "err", err)
		reply = wire.Error{Code: wire.CodeInternal, Message: fmt.Sprintf("%s %q: %v", op, key, err)}
	}
	c.send(id, reply)
}

func (c *serverConn) scope(key string) string { return scope(c.s.cfg.JobID, c.gen, key) }

// scope is where key of a job's generation lives in the KV; with an empty
// key, the prefix of all of that generation's keys.
func scope(job string, gen uint64, key string) string {
	return job + "/" + strconv.FormatUint(gen, 10) + "/" + key
}

// mayHaveStored reports whether a Set that returned err may have stored its
// value: it did unless it failed, and it may have when it failed by running
// out of time or being cancelled (etcd may apply a put whose reply is
// lost). Only a value certainly not stored is refunded, so that the quota
// never undercounts what a store holds.
func mayHaveStored(err error) bool {
	return err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
