//go:build !linux

package control

import (
	"errors"
	"net"
)

// peerCred is only implemented on Linux (SO_PEERCRED); elsewhere every
// connection is denied.
func peerCred(*net.UnixConn) (pid, uid int, err error) {
	return 0, 0, errors.New("peer credentials are not supported on this platform")
}
