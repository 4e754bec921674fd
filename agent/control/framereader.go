package control

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/ddp-agent/ddp-agent/wire"
)

// frameReader reads a connection's frames under the frame deadline: a
// connection may idle between frames for as long as it likes (the shim
// keeps one open for the whole run and may send nothing for minutes), but
// once the first byte of a frame has arrived, the rest must follow within
// timeout. Without it, a worker that stops halfway through a frame would
// hold the connection's goroutine and its partial buffer forever. It is
// used by the connection's one reading goroutine only.
type frameReader struct {
	nc      net.Conn
	timeout time.Duration
	started bool // a byte of the current frame has arrived
}

// Read reads from the connection and starts the frame deadline at the
// frame's first byte.
func (r *frameReader) Read(p []byte) (int, error) {
	n, err := r.nc.Read(p)
	if n > 0 && !r.started {
		r.started = true
		if derr := r.nc.SetReadDeadline(time.Now().Add(r.timeout)); derr != nil && err == nil {
			err = fmt.Errorf("set frame deadline: %w", derr)
		}
	}
	return n, err
}

// next reads the next frame, waiting without limit for it to start. An
// error for a frame that started and did not finish in time wraps
// errFrameTimeout (and os.ErrDeadlineExceeded).
func (r *frameReader) next() (wire.Frame, error) {
	r.started = false
	if err := r.nc.SetReadDeadline(time.Time{}); err != nil {
		return wire.Frame{}, fmt.Errorf("clear frame deadline: %w", err)
	}
	f, err := wire.ReadFrame(r, wire.MaxPayload)
	if err != nil && r.started && errors.Is(err, os.ErrDeadlineExceeded) {
		return wire.Frame{}, fmt.Errorf("%w: not complete %v after its first byte: %w", errFrameTimeout, r.timeout, err)
	}
	return f, err
}

// errFrameTimeout: a worker started a frame and did not finish it within
// Config.FrameTimeout.
var errFrameTimeout = errors.New("incomplete frame")
