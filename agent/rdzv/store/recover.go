package store

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// No request may crash the agent that hosts a store member. etcd 3.7.3's
// Status handler panics on a member that was just removed from the
// cluster ("failed to find local ID in cluster members"), as an agent's
// member is when the agent was frozen past its lease and wakes: a client
// asking it for its status took the whole agent down. The member's
// handlers run inside the agent's process, so a panic in one is caught
// here and becomes the request's error.

// recoverUnary turns a unary handler's panic into an Internal error.
func recoverUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = recovered(log, info.FullMethod, p)
			}
		}()
		return handler(ctx, req)
	}
}

// recoverStream is recoverUnary for streams.
func recoverStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = recovered(log, info.FullMethod, p)
			}
		}()
		return handler(srv, ss)
	}
}

func recovered(log *slog.Logger, method string, p any) error {
	log.Error("the store member's handler panicked; the request fails, the agent goes on",
		"method", method, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	return status.Errorf(codes.Internal, "store member: %s panicked: %v", method, p)
}
