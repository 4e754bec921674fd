// Package control is ddp-agent's side of the local control channel to the
// worker processes it supervises: a Server on a unix socket that checks
// each peer's credentials and Hello, serves the job's key-value store (KV)
// for the shim's bootstrap, receives the workers' collective events and
// sends Abort. The frames and messages are package wire; the worker's side
// is ncclshim/agentconn.
package control
