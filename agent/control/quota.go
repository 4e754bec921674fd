package control

import "sync"

// rankGen is one rank in one generation: the unit of the KV quota.
type rankGen struct {
	gen  uint64
	rank int
}

// kvQuota counts the bytes of keys and values each rank has written with
// KVSet in each generation, against Config.KVBytesPerRank. A KVSet is
// charged when its frame is read, before it is queued, so the bytes a rank
// has in flight count as well as those stored: the agent's memory for a
// rank's values is bounded by the quota, whatever the store does. Only the
// current generation's counts are kept. It is safe for concurrent use.
type kvQuota struct {
	mu   sync.Mutex
	used map[rankGen]int64
}

func newKVQuota() *kvQuota { return &kvQuota{used: make(map[rankGen]int64)} }

// reserve charges the rank for key and valueLen bytes of value, or returns
// the limit that refuses them (and charges nothing).
func (q *kvQuota) reserve(gen uint64, rank int, key string, valueLen int, cfg Config) *limitError {
	k := rankGen{gen, rank}
	q.mu.Lock()
	defer q.mu.Unlock()
	used := q.used[k]
	if err := checkKVSet(key, valueLen, used, rank, cfg); err != nil {
		return err
	}
	q.used[k] = used + int64(len(key)+valueLen)
	return nil
}

// refund gives back n bytes charged by reserve, for a write that never
// reached the store. A generation dropped meanwhile stays dropped.
func (q *kvQuota) refund(gen uint64, rank int, n int64) {
	k := rankGen{gen, rank}
	q.mu.Lock()
	defer q.mu.Unlock()
	if used, ok := q.used[k]; ok {
		if used -= n; used > 0 {
			q.used[k] = used
		} else {
			delete(q.used, k)
		}
	}
}

// usage returns the bytes charged to rank in gen.
func (q *kvQuota) usage(gen uint64, rank int) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.used[rankGen{gen, rank}]
}

// keepOnly forgets the counts of every generation but gen: their workers
// are gone and their keys are garbage.
func (q *kvQuota) keepOnly(gen uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for k := range q.used {
		if k.gen != gen {
			delete(q.used, k)
		}
	}
}

// drop forgets the counts of gen, whose keys were deleted from the store.
func (q *kvQuota) drop(gen uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for k := range q.used {
		if k.gen == gen {
			delete(q.used, k)
		}
	}
}
