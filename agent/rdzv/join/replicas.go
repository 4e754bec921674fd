package join

import (
	"fmt"
	"net"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// storeReplicas is how many agents run a member of the embedded store
// when the job can have that many nodes: any one of them may be lost,
// the first included, without losing the store.
const storeReplicas = 3

// storeSecurity is the TLS of the embedded store and its clients.
//
// With --rdzv-token, and without TLS files of the user's, every client and
// every member presents a certificate of the job's CA, which is derived
// from the token (store.WriteJobTLS): nobody without the token reads or
// writes a key, or joins the raft group. With the user's TLS files, those
// serve the clients as before, and the job's CA guards the members' raft
// traffic. An external etcd (--rdzv-backend etcd) is the user's to secure.
type storeSecurity struct {
	client, server, peer *store.TLSFiles
	job                  *store.JobTLS // nil without a token
}

func (o *opener) storeSecurity() (*storeSecurity, error) {
	cfg := o.cfg
	sec := &storeSecurity{client: cfg.TLS, server: cfg.TLS}
	if cfg.Backend == External || cfg.Token == "" {
		return sec, nil
	}
	job, err := store.OpenJobTLS(cfg.Token)
	if err != nil {
		return nil, fmt.Errorf("the rendezvous store's certificates: %w", err)
	}
	sec.job, sec.peer = job, job.Files
	if cfg.TLS == nil {
		sec.client, sec.server = job.Files, job.Files
	}
	return sec, nil
}

func (s *storeSecurity) close() {
	if s.job != nil {
		s.job.Close()
	}
}

// replicate starts keeping the embedded store at storeReplicas members,
// this agent's own included when it gets one; srv is the member this agent
// started (nil: none). addr is how the other agents reach this one.
func (o *opener) replicate(cli *store.Client, srv *store.Server, sec *storeSecurity, prefix, addr string) (*store.Replicas, error) {
	host := addr
	if net.ParseIP(host) == nil {
		ip := o.localIP(host)
		if ip == nil {
			return nil, fmt.Errorf("--local-addr %s: not an address of this host, which a store member could bind", addr)
		}
		host = ip.String()
	}
	return store.Replicate(store.ReplicaConfig{
		Client: cli, Own: srv, Want: storeReplicas, Prefix: prefix + "/_store/members/",
		TTL: o.cfg.TTL, Host: host, TLS: sec.server, PeerTLS: sec.peer,
		QuotaBytes: o.cfg.StoreQuota, Logger: o.log.With("subsystem", "etcd"),
	}), nil
}
