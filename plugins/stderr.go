package plugins

import (
	"context"
	"os"
	"sync"

	"google.golang.org/grpc"
)

// stderrKeeper gives the plugin its process's stderr back.
//
// go-plugin's Serve points os.Stderr at a pipe of its own, just before it
// serves, and streams the pipe to the agent over gRPC (StreamStdio). That
// stream dies with the process: what a plugin writes to os.Stderr and
// then exits (a last error, then os.Exit) was lost most of the time. The
// agent reads the process's own stderr (fd 2) to its end, even after the
// exit, and keeps its last lines for the failure's log line.
//
// The log package (and slog's default, which writes through it) keeps
// the *os.File it was given at init, fd 2: go-plugin does not redirect
// it, and neither does this.
type stderrKeeper struct {
	real *os.File // os.Stderr before go-plugin's Serve
	once sync.Once
}

func newStderrKeeper() *stderrKeeper { return &stderrKeeper{real: os.Stderr} }

// restore puts os.Stderr back, once. Every call the server takes comes
// after go-plugin's swap (it swaps, then serves), and restore runs ahead
// of each call's handler: the plugin's code, in any call, writes to fd 2.
// The agent's side opens go-plugin's own streams as soon as it connects,
// so os.Stderr is back before the first of the plugin's calls, Info.
func (k *stderrKeeper) restore() {
	k.once.Do(func() { os.Stderr = k.real })
}

// serverOptions restore os.Stderr ahead of every call's handler: go-plugin's
// own services and the plugin's, unary and streams.
func (k *stderrKeeper) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			k.restore()
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			k.restore()
			return handler(srv, ss)
		}),
	}
}
