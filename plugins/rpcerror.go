package plugins

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RPCError turns the error of a call to a plugin into what the agent
// prints. An error the plugin's own code returned (gRPC's UNKNOWN,
// INVALID_ARGUMENT, FAILED_PRECONDITION) comes back as the plugin's words
// alone: "option command is required", not "rpc error: code = Unknown
// desc = ...". The end of the caller's ctx comes back as ctx's error,
// so errors.Is(err, context.Canceled) holds, and so does a deadline that
// passed on either side. Anything else (the process
// gone, the connection broken) keeps gRPC's status, prefixed with call.
func RPCError(ctx context.Context, call string, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", call, ctxErr)
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", call, err)
	}
	switch st.Code() {
	case codes.Unknown, codes.InvalidArgument, codes.FailedPrecondition:
		return errors.New(st.Message())
	case codes.DeadlineExceeded:
		// The deadline travels with the call, and the plugin's side may
		// see it pass a moment before the caller's ctx does.
		return fmt.Errorf("%s: %w", call, context.DeadlineExceeded)
	}
	return fmt.Errorf("%s: %w", call, err)
}
