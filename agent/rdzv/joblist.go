package rdzv

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// This file lists the jobs of a store for `ddp-agent status`. Like
// ReadStatus it only reads, and everything it shows is of one revision.

// JobList is every job in a store, as ListJobs read it at one revision.
// Its JSON form is stable: {"revision", "hosted", "jobs": [JobSummary]}.
type JobList struct {
	Revision int64 `json:"revision"`
	// Hosted is the job an agent's embedded store was started for (the
	// store's HostKey); "" for a store no agent hosts.
	Hosted string       `json:"hosted,omitempty"`
	Jobs   []JobSummary `json:"jobs"`
}

// IDs returns the jobs' ids, in order.
func (l *JobList) IDs() []string {
	ids := make([]string, len(l.Jobs))
	for i, j := range l.Jobs {
		ids[i] = j.ID
	}
	return ids
}

// Has reports whether the list holds job id.
func (l *JobList) Has(id string) bool {
	for _, j := range l.Jobs {
		if j.ID == id {
			return true
		}
	}
	return false
}

// JobSummary is one line of a JobList.
type JobSummary struct {
	ID         string `json:"id"`
	Generation uint64 `json:"generation"`
	Phase      Phase  `json:"phase"` // "" when the state is missing or malformed
	Nodes      int    `json:"nodes"` // registered agents
	// Problem says what is wrong with the job's keys, if anything.
	Problem string `json:"problem,omitempty"`
}

// listBatch is how many jobs one transaction summarizes: three reads each
// stay under etcd's default limit of 128 operations per transaction.
const listBatch = 40

// ListJobs lists the jobs under root, sorted by id. Every job's keys sort
// together under root+id+"/", so it skips from one job to the next with a
// one-key read each instead of reading the workers' keys too, all pinned
// to the revision of the first read.
func ListJobs(ctx context.Context, c *store.Client, root string) (*JobList, error) {
	cli := c.Etcd()
	hostResp, err := cli.Get(ctx, HostKey)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	l := &JobList{Revision: hostResp.Header.Revision, Jobs: []JobSummary{}}
	if len(hostResp.Kvs) > 0 {
		l.Hosted = string(hostResp.Kvs[0].Value)
	}
	ids, err := jobIDs(ctx, cli, root, l.Revision)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	for len(ids) > 0 {
		batch := ids[:min(listBatch, len(ids))]
		ids = ids[len(batch):]
		var ops []clientv3.Op
		for _, id := range batch {
			p := Prefix(root, id)
			ops = append(ops,
				clientv3.OpGet(p+jobKey, clientv3.WithRev(l.Revision)),
				clientv3.OpGet(p+stateKey, clientv3.WithRev(l.Revision)),
				clientv3.OpGet(p+nodesDir, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(l.Revision)))
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("list jobs: %w", err)
		}
		for i, id := range batch {
			job := resp.Responses[3*i].GetResponseRange()
			state := resp.Responses[3*i+1].GetResponseRange()
			nodes := resp.Responses[3*i+2].GetResponseRange()
			if len(job.Kvs) == 0 && len(state.Kvs) == 0 && nodes.Count == 0 {
				continue // only leftovers, such as the workers' keys: no job
			}
			l.Jobs = append(l.Jobs, summarizeJob(Prefix(root, id), id, job.Kvs, state.Kvs, int(nodes.Count)))
		}
	}
	return l, nil
}

// jobIDs returns the ids of the jobs under root at revision rev, sorted.
func jobIDs(ctx context.Context, cli *clientv3.Client, root string, rev int64) ([]string, error) {
	end := clientv3.GetPrefixRangeEnd(root)
	var ids []string
	for from := root; ; {
		resp, err := cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(1), clientv3.WithRev(rev))
		if err != nil {
			return nil, err
		}
		if len(resp.Kvs) == 0 {
			break
		}
		key := string(resp.Kvs[0].Key)
		id, _, isDir := strings.Cut(strings.TrimPrefix(key, root), "/")
		if !isDir { // a key of its own under root, such as HostKey
			from = key + "\x00"
			continue
		}
		if id != "" {
			ids = append(ids, id)
		}
		from = clientv3.GetPrefixRangeEnd(root + id + "/")
	}
	// Key order puts "t1-x/" before "t1/"; people expect "t1" first.
	sort.Strings(ids)
	return ids, nil
}

// summarizeJob is the line of job id, whose keys are under prefix, from
// its job and state keys and its count of registered agents.
func summarizeJob(prefix, id string, job, state []*mvccpb.KeyValue, nodes int) JobSummary {
	js := JobSummary{ID: id, Nodes: nodes}
	var problems []string
	if len(job) == 0 {
		problems = append(problems, "no job key")
	} else if err := decode(prefix+jobKey, job[0].Value, &JobInfo{}); err != nil {
		problems = append(problems, err.Error())
	}
	var st State
	if len(state) == 0 {
		problems = append(problems, "no state key")
	} else if err := decode(prefix+stateKey, state[0].Value, &st); err != nil {
		problems = append(problems, err.Error())
	} else if !st.Phase.valid() {
		problems = append(problems, fmt.Sprintf("unknown phase %q", st.Phase))
	} else {
		js.Generation, js.Phase = st.Generation, st.Phase
	}
	js.Problem = strings.Join(problems, "; ")
	return js
}
