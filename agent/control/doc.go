// Package control is ddp-agent's side of the local control channel to the
// worker processes it supervises: a Server on a unix socket that checks
// each peer's credentials and Hello, serves the job's key-value store (KV)
// for the shim's bootstrap, receives the workers' collective events and
// sends Abort. The frames and messages are package wire; the worker's side
// is shim/agentconn.
//
// A worker cannot make the server grow without bound: each rank has a quota
// of KV bytes per generation and a largest value, each process and each rank
// a number of connections, and every Hello and every frame, once started, a
// deadline (Config; docs/control-socket.md, "Limits"). The decisions are
// pure functions (checkKVSet, checkConn, nextLimitLog); the counting is
// kvQuota and connCounter.
package control
