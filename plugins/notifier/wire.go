package notifier

import (
	"fmt"
	"math"

	"github.com/ddp-agent/ddp-agent/plugins/internal/wiretime"
	notifierv1 "github.com/ddp-agent/ddp-agent/plugins/notifier/proto"
)

// eventToWire refuses a rank the wire cannot carry (below -1, or past
// int32) rather than send a wrong one.
func eventToWire(ev Event) (*notifierv1.Event, error) {
	if ev.Rank < -1 || ev.Rank > math.MaxInt32 {
		return nil, fmt.Errorf("rank %d out of range (-1 for none)", ev.Rank)
	}
	return &notifierv1.Event{
		Kind:         string(ev.Kind),
		TimeUnixNano: wiretime.To(ev.Time),
		Job:          ev.Job,
		Node:         ev.Node,
		Generation:   ev.Generation,
		Attempt:      int64(ev.Attempt),
		Rank:         int32(ev.Rank),
		Message:      ev.Message,
		Details:      ev.Details,
	}, nil
}

// eventFromWire refuses an event without a kind or a rank below -1 (a
// client in another language that forgot -1 for none sends 0, which is a
// rank; nothing can catch that).
func eventFromWire(msg *notifierv1.Event) (Event, error) {
	if msg.GetKind() == "" {
		return Event{}, fmt.Errorf("no kind")
	}
	if msg.GetRank() < -1 {
		return Event{}, fmt.Errorf("rank %d out of range (-1 for none)", msg.GetRank())
	}
	return Event{
		Kind:       EventKind(msg.GetKind()),
		Time:       wiretime.From(msg.GetTimeUnixNano()),
		Job:        msg.GetJob(),
		Node:       msg.GetNode(),
		Generation: msg.GetGeneration(),
		Attempt:    int(msg.GetAttempt()),
		Rank:       int(msg.GetRank()),
		Message:    msg.GetMessage(),
		Details:    msg.GetDetails(),
	}, nil
}
