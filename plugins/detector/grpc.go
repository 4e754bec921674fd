package detector

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"

	"github.com/ddp-agent/ddp-agent/plugins"
	detectorv1 "github.com/ddp-agent/ddp-agent/plugins/detector/proto"
)

// server answers the Detector service from a plugin's Detector.
type server struct {
	detectorv1.UnimplementedDetectorServer
	impl Detector
}

func (s *server) Configure(ctx context.Context, req *detectorv1.ConfigureRequest) (*detectorv1.ConfigureResponse, error) {
	sched, err := s.impl.Configure(ctx, plugins.Config(req.GetConfig()))
	if err != nil {
		return nil, err
	}
	return &detectorv1.ConfigureResponse{EveryNanos: int64(sched.Every)}, nil
}

// Watch streams the detector's findings until the agent cancels the call
// (the stream's context), in batches (batch.go). A finding the protocol
// cannot carry is refused to the detector through emit's error, which
// its Watch returns: the stream then ends with that error, and the agent
// sees why. What the detector emitted before its Watch returned is sent
// before the stream ends.
func (s *server) Watch(_ *detectorv1.WatchRequest, stream grpc.ServerStreamingServer[detectorv1.Findings]) error {
	ctx, cancel := context.WithCancel(stream.Context())
	b := newBatcher(stream.Send)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		b.run(ctx, errWatchEnded)
	}()
	err := s.impl.Watch(stream.Context(), func(f Finding) error {
		msg, err := findingToWire(f)
		if err != nil {
			return fmt.Errorf("finding refused: %w", err)
		}
		return b.add(msg)
	})
	cancel()
	<-sent
	if ferr := b.flush(); err == nil && ferr != nil && stream.Context().Err() == nil {
		err = ferr
	}
	return err
}

// errWatchEnded is what emit returns once the stream is gone.
var errWatchEnded = errors.New("detector: the agent ended the watch")

// client is the agent's side of a detector plugin.
type client struct {
	plugins.Described
	rpc detectorv1.DetectorClient
}

func (c client) Configure(ctx context.Context, cfg plugins.Config) (Schedule, error) {
	resp, err := c.rpc.Configure(ctx, &detectorv1.ConfigureRequest{Config: cfg})
	if err != nil {
		return Schedule{}, plugins.RPCError(ctx, "configure", err)
	}
	return scheduleFromWire(resp), nil
}

// Watch passes each finding of the stream to emit until ctx ends (it
// returns ctx's error, wrapped), the plugin ends the stream (nil, or the
// plugin's error), emit fails (its error) or a finding is out of the
// protocol's range (an error naming it; the stream is cancelled).
func (c client) Watch(ctx context.Context, emit func(Finding) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.Watch(ctx, &detectorv1.WatchRequest{})
	if err != nil {
		return fmt.Errorf("detector: %w", plugins.RPCError(ctx, "watch", err))
	}
	for n := 1; ; {
		batch, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("detector: %w", plugins.RPCError(ctx, "watch", err))
		}
		for _, msg := range batch.GetFindings() {
			f, err := findingFromWire(msg)
			if err != nil {
				return fmt.Errorf("detector: watch: finding %d refused: %w", n, err)
			}
			if err := emit(f); err != nil {
				return err
			}
			n++
		}
	}
}
