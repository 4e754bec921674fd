package control

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/wire"
)

// readUntilClosed reads frames from nc until the server closes it and
// returns the frames and how long that took; it fails t after limit.
func readUntilClosed(t *testing.T, nc net.Conn, limit time.Duration) ([]wire.Frame, time.Duration) {
	t.Helper()
	start := time.Now()
	nc.SetReadDeadline(start.Add(limit))
	var frames []wire.Frame
	for {
		f, err := wire.ReadFrame(nc, 0)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("connection still open after %v", limit)
			}
			return frames, time.Since(start)
		}
		frames = append(frames, f)
	}
}

// TestHalfFrameClosed: a worker that sends part of a frame and stops is
// told why and closed once the frame deadline has passed, with a log line;
// the other connections are unaffected.
func TestHalfFrameClosed(t *testing.T) {
	const timeout = 200 * time.Millisecond
	kvset := encode(t, 2, wire.KVSet{Key: "k", Value: make([]byte, 100)})
	tests := []struct {
		name string
		send []byte
	}{
		{"half header", kvset[:5]},
		{"header only", kvset[:wire.HeaderSize]},
		{"half payload", kvset[:len(kvset)/2]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			warns := newWarnCounter(t)
			s := startServer(t, Config{FrameTimeout: timeout, Logger: slog.New(warns)})
			good, _ := dial(t, s, selfHello(0))
			nc := rawConn(t, s, true)
			if _, err := nc.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			frames, took := readUntilClosed(t, nc, 5*time.Second)
			if took < timeout*3/4 {
				t.Errorf("closed after %v, want about %v", took, timeout)
			}
			if len(frames) != 1 || frames[0].Type != wire.TypeError {
				t.Errorf("got %d frames %v, want one Error", len(frames), frames)
			} else if m, err := wire.Decode(frames[0]); err != nil || m.(wire.Error).Code != wire.CodeBadRequest {
				t.Errorf("reply: got %#v %v, want code %v", m, err, wire.CodeBadRequest)
			}
			if n := warns.count("worker stopped halfway through a frame, closing connection"); n != 1 {
				t.Errorf("log lines: got %d, want 1", n)
			}
			if err := good.KVSet(context.Background(), "k", nil); err != nil {
				t.Errorf("other client: %v", err)
			}
			waitFor(t, "one connection", func() bool { return s.Conns() == 1 })
		})
	}
}

// TestIdleBetweenFrames: a connection idle for several frame deadlines
// between frames stays open and works; a KVGet that waits in the server
// longer than the frame deadline is answered; a frame written in pieces,
// each within the deadline, is read whole.
func TestIdleBetweenFrames(t *testing.T) {
	leakCheck(t)
	const timeout = 300 * time.Millisecond
	s := startServer(t, Config{FrameTimeout: timeout, HandshakeTimeout: timeout})
	c, _ := dial(t, s, selfHello(0))
	time.Sleep(2 * timeout)
	if err := c.KVSet(context.Background(), "a", []byte("1")); err != nil {
		t.Fatalf("KVSet after idling: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := c.KVGet(context.Background(), "late", 5*time.Second)
		got <- err
	}()
	time.Sleep(2 * timeout)
	other, _ := dial(t, s, selfHello(0))
	if err := other.KVSet(context.Background(), "late", []byte("2")); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Errorf("KVGet that waited %v in the server: %v", 2*timeout, err)
	}

	nc := rawConn(t, s, true)
	b := encode(t, 9, wire.KVSet{Key: "pieces", Value: []byte("v")})
	time.Sleep(2 * timeout) // idle after Hello
	for _, piece := range [][]byte{b[:3], b[3:14], b[14:]} {
		if _, err := nc.Write(piece); err != nil {
			t.Fatal(err)
		}
		time.Sleep(timeout / 10)
	}
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if f, err := wire.ReadFrame(nc, 0); err != nil || f.Type != wire.TypeOK || f.ID != 9 {
		t.Errorf("reply to a frame in pieces: got %v id %d, %v; want OK id 9", f.Type, f.ID, err)
	}
}

// TestHelloDeadline: a connection that sends no Hello, or half of one, is
// closed once the handshake deadline has passed.
func TestHelloDeadline(t *testing.T) {
	const timeout = 200 * time.Millisecond
	hello := encode(t, 1, selfHello(0))
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"nothing", nil},
		{"half hello", hello[:len(hello)/2]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			s := startServer(t, Config{HandshakeTimeout: timeout})
			nc := rawConn(t, s, false)
			if _, err := nc.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			frames, took := readUntilClosed(t, nc, 5*time.Second)
			if took < timeout*3/4 || len(frames) != 0 {
				t.Errorf("closed after %v with %d frames, want about %v and none", took, len(frames), timeout)
			}
			if got := s.Conns(); got != 0 {
				t.Errorf("Conns: got %d, want 0", got)
			}
		})
	}
}

// TestFrameReader: the deadline starts at a frame's first byte, not when
// next is called.
func TestFrameReader(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	fr := &frameReader{nc: a, timeout: 50 * time.Millisecond}
	frame := encode(t, 1, wire.OK{})
	go func() {
		time.Sleep(200 * time.Millisecond) // idle: longer than the deadline
		b.Write(frame[:4])
		time.Sleep(10 * time.Millisecond)
		b.Write(frame[4:])
		b.Write(frame[:4]) // then stop halfway
	}()
	if f, err := fr.next(); err != nil || f.Type != wire.TypeOK {
		t.Fatalf("first frame: got %v %v, want OK", f.Type, err)
	}
	if _, err := fr.next(); !errors.Is(err, errFrameTimeout) {
		t.Errorf("half frame: got %v, want errFrameTimeout", err)
	}
}
