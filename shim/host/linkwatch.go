package host

import (
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddp-agent/ddp-agent/shim/failure"
)

// A link that goes down, or a host that freezes, resets nothing: the
// sender retransmits for tcp_retries2 (about 15 minutes) and a receiver
// waits for ever. Two mechanisms bound that by Config.LinkTimeout, both
// counting only the neighbour's kernel, which answers whatever its
// application does:
//
//   - A connection with nothing in flight (a receiving one, or any between
//     collectives) sends keepalive probes every LinkTimeout/10 (at least a
//     second, the kernel's unit) once idle that long (tune); the kernel
//     drops it with ETIMEDOUT when they have gone unanswered until
//     LinkTimeout after the peer's last word (2 s at the least).
//   - A connection with data in flight is watched here, every
//     LinkTimeout/4: unacknowledged bytes and no acknowledgement for
//     LinkTimeout fail the Comm, between 1 and 1.25 LinkTimeouts after the
//     link died.
//
// Not TCP_USER_TIMEOUT, which would do the second alone: since Linux 5.11
// it also drops a connection whose receiver keeps its window shut for that
// long even though it answers every probe (tcp_probe_timer), which is what
// a rank that calls AllReduce seconds after the others looks like
// (TestNetnsAllReduce's late rank). Shut-window probing has no
// unacknowledged bytes (the data waits unsent), so the rule below leaves it
// alone; a link that dies during it is found by the neighbour's keepalive,
// whose failure closes the rest of the ring.

// watchLinks checks both connections every linkTimeout/4 until the Comm is
// done.
func (c *Comm) watchLinks(linkTimeout time.Duration) {
	defer c.wg.Done()
	tick := time.NewTicker(max(linkTimeout/4, 10*time.Millisecond))
	defer tick.Stop()
	next, prev := mod(c.rank+1, c.size), mod(c.rank-1, c.size)
	for {
		select {
		case <-c.done:
			return
		case <-tick.C:
		}
		for _, l := range []struct {
			conn *net.TCPConn
			peer int
		}{{c.send, next}, {c.recv, prev}} {
			unacked, silent, err := linkSilence(l.conn)
			if err != nil || unacked == 0 || silent < linkTimeout {
				continue // a closed socket fails elsewhere
			}
			c.fail(failure.Peer(l.peer, failure.PeerLost, fmt.Errorf(
				"rank %d: connection with rank %d: %w: its host acknowledged nothing for %v with %d segments in flight (link down or host frozen)",
				c.rank, l.peer, failure.ErrPeer, silent.Round(time.Millisecond), unacked)))
			return
		}
	}
}

// linkSilence returns how many segments conn has in flight and how long
// ago the peer last acknowledged anything, from the kernel's TCP_INFO.
func linkSilence(conn *net.TCPConn) (unacked uint32, silent time.Duration, err error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var info *unix.TCPInfo
	cerr := raw.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	})
	if cerr != nil {
		return 0, 0, cerr
	}
	if err != nil {
		return 0, 0, err
	}
	return info.Unacked, time.Duration(info.Last_ack_recv) * time.Millisecond, nil
}
