package nccl

import (
	"time"

	"github.com/ddp-agent/ddp-agent/shim/cuda"
)

// clock maps GPU event times to the host clock: an anchor event recorded
// on an idle stream of our own completes at once, so its GPU time is the
// host time around its synchronization.
type clock struct {
	cu     *cuda.Lib
	stream cuda.Stream
	ev     cuda.Event
	host   time.Time
	ok     bool
}

func (k *clock) anchor() error {
	if !k.ok {
		s, err := k.cu.NewStream()
		if err != nil {
			return err
		}
		ev, err := k.cu.NewEvent()
		if err != nil {
			k.cu.DestroyStream(s)
			return err
		}
		k.stream, k.ev, k.ok = s, ev, true
	}
	t0 := time.Now()
	if err := k.cu.Record(k.ev, k.stream.Ptr()); err != nil {
		return err
	}
	if err := k.cu.Sync(k.ev); err != nil {
		return err
	}
	t1 := time.Now()
	k.host = t0.Add(t1.Sub(t0) / 2)
	return nil
}

// times are when ev's collective started and ended on the GPU, host clock.
func (k *clock) times(ev EventPair) (start, end time.Time, err error) {
	fromAnchor, err := k.cu.Elapsed(k.ev, ev.Start)
	if err != nil {
		return
	}
	d, err := k.cu.Elapsed(ev.Start, ev.End)
	if err != nil {
		return
	}
	start = k.host.Add(fromAnchor)
	return start, start.Add(d), nil
}

func (k *clock) close() {
	if k.ok {
		k.cu.DestroyEvent(k.ev)
		k.cu.DestroyStream(k.stream)
	}
}
