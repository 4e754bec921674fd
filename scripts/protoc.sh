#!/usr/bin/env bash
# Regenerates the plugin protocol's Go code from its .proto files:
#
#   plugins/proto/info.proto                 ddpagent.plugins.v1  (every plugin)
#   plugins/detector/proto/detector.proto    ddpagent.detector.v1
#   plugins/notifier/proto/notifier.proto    ddpagent.notifier.v1
#
#   scripts/protoc.sh
#
# The generated *.pb.go files are committed (CI does not regenerate them),
# so run this after editing a .proto and commit both. protoc itself comes
# from the system (Debian: apt-get install protobuf-compiler); the two Go
# generators are pinned below and installed into a temporary GOBIN, so the
# output does not depend on whatever is on PATH.
set -euo pipefail

PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.11
PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
PROTOS=(
	plugins/proto/info.proto
	plugins/detector/proto/detector.proto
	plugins/notifier/proto/notifier.proto
)
say() { echo "protoc.sh: $*" >&2; }

cd "$(dirname "$0")/.."
if ! command -v protoc >/dev/null 2>&1; then
	say "protoc is not installed (Debian: apt-get install -y protobuf-compiler)"
	exit 1
fi
GO=${GO:-go}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
say "installing $PROTOC_GEN_GO and $PROTOC_GEN_GO_GRPC into $bin"
GOBIN=$bin "$GO" install "$PROTOC_GEN_GO"
GOBIN=$bin "$GO" install "$PROTOC_GEN_GO_GRPC"

# -I . registers each file under its path in the repository
# (plugins/proto/info.proto, not info.proto), so the names cannot collide in
# the global protobuf registry with another module's file of the same name.
PATH=$bin:$PATH protoc -I . \
	--go_out=. --go_opt=paths=source_relative \
	--go-grpc_out=. --go-grpc_opt=paths=source_relative \
	"${PROTOS[@]}"
say "$(protoc --version), regenerated: ${PROTOS[*]}"
