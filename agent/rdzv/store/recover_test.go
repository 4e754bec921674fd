package store

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// panicky panics on every Check, as etcd's Status did on a removed member.
type panicky struct {
	healthpb.UnimplementedHealthServer
}

func (panicky) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	panic("failed to find local ID in cluster members")
}

// TestRecoverHandlerPanic: a handler's panic fails the request with an
// Internal error and the server (the agent, for a store member) goes on
// serving; without the interceptors it would end the process.
func TestRecoverHandlerPanic(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := testLogger(t)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(recoverUnary(log)), grpc.ChainStreamInterceptor(recoverStream(log)))
	healthpb.RegisterHealthServer(srv, panicky{})
	go srv.Serve(ln)
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for range 2 {
		_, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
		if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "panicked") {
			t.Fatalf("Check: %v, want an Internal error naming the panic", err)
		}
	}
}
