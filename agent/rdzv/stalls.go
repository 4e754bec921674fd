package rdzv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxStallsBytes bounds one node's stalls report in the store: status
// reads every node's in one request. The telemetry report that fills it
// stays far below (telemetry.Report's limits).
const MaxStallsBytes = 64 << 10

// publishTimeout bounds one PublishStalls. A report is worth less than
// the agent's time: a store that does not answer now gets the next one.
const publishTimeout = 3 * time.Second

// PublishStalls puts report at <prefix>stalls/<node> on this node's lease,
// replacing the last one, for `ddp-agent status`. The report is opaque to
// the rendezvous (telemetry.Report encodes it): it must be a JSON object
// of at most MaxStallsBytes, or nothing is written.
//
// It blocks for one request to the store, at most publishTimeout and never
// past ctx. It fails after Close and while the lease is lost (a key not
// on the lease would outlive the agent); the lease a later Next registers
// takes the next report. Safe to call concurrently with Next and the
// other methods; of concurrent calls the last to reach the store wins.
func (e *Membership) PublishStalls(ctx context.Context, report []byte) error {
	if e.bg.Err() != nil {
		return fmt.Errorf("publish stalls of node %s: the rendezvous is closed", e.node)
	}
	if len(report) > MaxStallsBytes {
		return fmt.Errorf("publish stalls of node %s: a report of %d bytes, more than %d", e.node, len(report), MaxStallsBytes)
	}
	if _, err := stallsObject(report); err != nil {
		return fmt.Errorf("publish stalls of node %s: %w", e.node, err)
	}
	lease, lost := e.leaseChan()
	select {
	case <-lost:
		return fmt.Errorf("publish stalls of node %s: this node's lease on the rendezvous store is lost", e.node)
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	if _, err := e.cli.Put(ctx, e.key(stallsDir+e.node), string(report), clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("rendezvous store at %s: publish stalls of node %s: %w", e.cfg.Endpoint, e.node, err)
	}
	return nil
}

// stallsObject is raw, a JSON object, compacted onto one line (status
// --json prints one line), or why it is none. It does not look inside:
// the report is telemetry's.
func stallsObject(raw []byte) (json.RawMessage, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, err
	}
	if b.Len() == 0 || b.Bytes()[0] != '{' {
		return nil, errors.New("not a JSON object")
	}
	return json.RawMessage(b.Bytes()), nil
}
