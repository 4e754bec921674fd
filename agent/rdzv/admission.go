package rdzv

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func tokenMAC(token, id string) string {
	if token == "" {
		return ""
	}
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("ddp-agent rendezvous " + id))
	return hex.EncodeToString(m.Sum(nil))
}

func (e *Membership) checkHost(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if e.cfg.Hosted {
		txn, err := e.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(HostKey), "=", 0)).
			Then(clientv3.OpPut(HostKey, e.cfg.JobID)).
			Else(clientv3.OpGet(HostKey)).Commit()
		if err != nil {
			return fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
		}
		if txn.Succeeded {
			return nil
		}
		if kvs := txn.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 && string(kvs[0].Value) != e.cfg.JobID {
			return &ForeignJobError{Endpoint: e.cfg.Endpoint, Hosted: string(kvs[0].Value), Mine: e.cfg.JobID}
		}
		return nil
	}
	resp, err := e.cli.Get(ctx, HostKey)
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	if len(resp.Kvs) > 0 && string(resp.Kvs[0].Value) != e.cfg.JobID {
		return &ForeignJobError{Endpoint: e.cfg.Endpoint, Hosted: string(resp.Kvs[0].Value), Mine: e.cfg.JobID}
	}
	return nil
}

func (e *Membership) createOrCheckJob(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	now := time.Now()
	job := JobInfo{ID: e.cfg.JobID, Created: now, NNodesMin: e.cfg.NNodesMin, NNodesMax: e.cfg.NNodesMax, MaxRestarts: e.cfg.MaxRestarts, TokenMAC: e.mac}
	st := State{Generation: 0, Phase: Joining, Run: newRunID(), Reason: "job created", Since: now, MaxRestarts: e.cfg.MaxRestarts}
	txn, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.key(jobKey)), "=", 0)).
		Then(clientv3.OpPut(e.key(jobKey), encode(job)), clientv3.OpPut(e.key(stateKey), encode(st))).
		Else(clientv3.OpGet(e.key(jobKey))).Commit()
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: create job: %w", e.cfg.Endpoint, err)
	}
	if txn.Succeeded {
		e.log.Info("created job in rendezvous store", "job", e.cfg.JobID, "run", st.Run, "max_restarts", e.cfg.MaxRestarts)
		return nil
	}
	kvs := txn.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return fmt.Errorf("rendezvous store at %s: job %q vanished while joining", e.cfg.Endpoint, e.cfg.JobID)
	}
	var have JobInfo
	if err := decode(e.key(jobKey), kvs[0].Value, &have); err != nil {
		return fmt.Errorf("refused: %w", err)
	}
	if have.NNodesMin < 1 || have.NNodesMax < have.NNodesMin || have.MaxRestarts < 0 {
		return fmt.Errorf("refused: malformed value at %s: nnodes %d:%d, max_restarts %d", e.key(jobKey), have.NNodesMin, have.NNodesMax, have.MaxRestarts)
	}
	if !hmac.Equal([]byte(have.TokenMAC), []byte(e.mac)) {
		return ErrTokenMismatch
	}
	if have.NNodesMin != e.cfg.NNodesMin || have.NNodesMax != e.cfg.NNodesMax || have.MaxRestarts != e.cfg.MaxRestarts {
		e.log.Warn("this agent's settings differ from the job's; the job's apply",
			"job_nnodes", fmt.Sprintf("%d:%d", have.NNodesMin, have.NNodesMax), "job_max_restarts", have.MaxRestarts,
			"nnodes", fmt.Sprintf("%d:%d", e.cfg.NNodesMin, e.cfg.NNodesMax), "max_restarts", e.cfg.MaxRestarts)
		e.cfg.NNodesMin, e.cfg.NNodesMax, e.cfg.MaxRestarts = have.NNodesMin, have.NNodesMax, have.MaxRestarts
	}
	return nil
}
