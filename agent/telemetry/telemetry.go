// Package telemetry holds what the agent learns from the workers'
// collective events: one record per rank and collective, on the analyzing
// agent's clock; the collectives they make up once every rank has
// reported; stalls, their stragglers, and hangs. Package stall computes
// them; package export turns them into OpenTelemetry traces and metrics,
// a Prometheus endpoint, and a Perfetto trace file.
package telemetry

import (
	"fmt"
	"time"

	"github.com/ddp-agent/ddp-agent/wire"
)

// StatusInFlight marks a record of a collective that the rank has entered
// and not finished: the shim reports one when a collective has been in
// flight for a while, so that a hang shows who arrived. End is zero. It is
// the wire's value, which the shim sends.
const StatusInFlight = wire.StatusInFlight

// StatusMark marks a record that is no collective: the rank started the
// forward pass of Step at Arrive (wire.StatusMark).
const StatusMark = wire.StatusMark

// Record is one rank's view of one collective. Times are on the clock of
// the agent that analyzes them (the leader): records from other nodes are
// corrected by the estimated offset before they get here.
type Record struct {
	Gen    uint64
	Step   uint64
	Bucket uint32
	Rank   int
	Bytes  uint64
	DType  uint8
	Status uint8 // the shim's status code (0 ok), or StatusInFlight

	Arrive time.Time // the hook was called: the rank's gradients were ready
	Start  time.Time // the collective started (the GPU's time with NCCL)
	End    time.Time // it finished; zero while in flight
}

// Done reports whether r is a final record (the collective finished, well
// or not), as opposed to an in-flight one.
func (r Record) Done() bool { return r.Status != StatusInFlight }

// IsMark reports whether r is a step mark rather than a collective's record.
func (r Record) IsMark() bool { return r.Status == StatusMark }

// The buckets from OwnBuckets up label ddp_agent's own collectives under
// InProcess, none a gradient's all-reduce: StateBucket the state's move in
// an in-process re-formation (_state.STATE_BUCKET in the Python package),
// BuffersBucket a model's buffers broadcast before its forward
// (_buffers.BUFFERS_BUCKET), and below them the script's own all-reduces
// (_collectives.SCRIPT_BUCKET down). DDP numbers its buckets from 0.
const (
	StateBucket   = 1<<31 - 1
	BuffersBucket = 1<<31 - 2
	OwnBuckets    = 1<<31 - 1<<20
)

// Gradient reports whether bucket labels one of DDP's gradient buckets,
// not one of ddp_agent's own collectives.
func Gradient(bucket uint32) bool { return bucket < OwnBuckets }

// Script reports whether bucket labels a training script's own collective
// (InProcess.all_reduce, barrier). The watch drops those: a barrier while
// rank 0 writes a checkpoint, seen, would be a hang past the timeout or a
// straggler every checkpoint, where the script's gloo barrier before was
// not seen at all ("What is watched" in docs/stalls-and-traces.md).
func Script(bucket uint32) bool { return bucket >= OwnBuckets && bucket < BuffersBucket }

// Key identifies a collective within a job.
type Key struct {
	Gen    uint64
	Step   uint64
	Bucket uint32
}

func (k Key) String() string {
	return fmt.Sprintf("generation %d step %d bucket %d", k.Gen, k.Step, k.Bucket)
}

// Key is the collective r belongs to.
func (r Record) Key() Key { return Key{Gen: r.Gen, Step: r.Step, Bucket: r.Bucket} }

// Worker says where a rank runs, for reports and span attributes.
type Worker struct {
	Rank      int
	LocalRank int
	Host      string
	PID       int
	GPU       string // UUID; empty on a CPU-only node
	GPUIndex  int    // index in CUDA order on its node; -1 without a GPU
	// GPUState is NVML's view of the GPU as its node's agent last read it
	// (nvml.GPUState.String), so the leader can report on other nodes'
	// GPUs; empty when unknown.
	GPUState string
	// GPUSlowdown and HostSlowdown are what its node's agent last saw
	// that would slow it down (nvml.GPUState.Slowdown,
	// hostmon.Slowdown): the evidence of a straggler's cause "gpu" or
	// "host"; empty when nothing.
	GPUSlowdown, HostSlowdown string
}

// Collective is one all-reduce as every rank saw it.
type Collective struct {
	Key
	Bytes   uint64
	DType   uint8
	Records []Record // one final record per rank, in rank order
	Stall   *Stall   // nil unless the collective was slow
}

// Duration is the longest any rank spent in the collective (End-Start):
// the ranks that came early spend their wait inside it.
func (c Collective) Duration() time.Duration {
	var d time.Duration
	for _, r := range c.Records {
		d = max(d, r.End.Sub(r.Start))
	}
	return d
}

// Stall describes a slow collective and who made it slow.
type Stall struct {
	Straggler int           // the rank that arrived last
	Late      time.Duration // how long after the last of the others it arrived
	Waiters   int           // the other ranks
	Waited    time.Duration // their wait summed: Σ (straggler's arrival − theirs)
	Threshold time.Duration // the duration above which a collective counts as a stall
	Median    time.Duration // the bucket's rolling median duration it was judged against
}

// Hang is a collective that has not finished long after some rank arrived.
type Hang struct {
	Key
	Since   time.Time // the first arrival
	Waiting []int     // ranks that arrived (in flight, or finished with an error)
	Missing []int     // ranks that never arrived
}

// Straggler is a rank that holds the job back step after step: late more
// often than chance, by more than the job's noise, at a cost (see package
// stall for the test).
type Straggler struct {
	Rank        int
	Last        int           // significant steps in which it was the straggler
	Steps       int           // recent steps looked at (the window)
	Significant int           // of which steps whose straggler waited out the noise band
	Late        time.Duration // the median wait it caused in its steps
	StepTime    time.Duration // the job's median step time over the window
	Noise       time.Duration // the noise band: waits below it are not counted
	Share       float64       // the waits it caused, as a share of step time
	P           float64       // the chance of being the straggler that often in a balanced job

	// Where its lateness comes from (package stall): how much more than
	// the other ranks' median it spent, median over its significant steps
	// whose phases are known (Phased of them; 0 when the hook does not
	// mark forward starts), before forward (Input: data loading, the
	// optimizer, anything between steps), in forward and backward up to
	// its last bucket (Compute), and waiting for its previous step's
	// all-reduces to finish (Comm). Together they make up its lateness.
	Input, Compute, Comm time.Duration
	Phased               int

	// Cause and Evidence say why, with the numbers behind it; the watch
	// sets them (stall.Explain), adding what NVML and the host show.
	Cause    Cause
	Evidence string
}

// Cause is why a persistent straggler is slow.
type Cause string

// The causes. Unknown is said, never a guess.
const (
	CauseInput   Cause = "input"   // time before forward grows: the data pipeline, or work between steps
	CauseCompute Cause = "compute" // forward and backward take longer, input does not
	CauseGPU     Cause = "gpu"     // compute is slow and NVML shows why: throttled, clocked down, shared
	CauseHost    Cause = "host"    // compute is slow and its threads wait for a CPU
	CauseNetwork Cause = "network" // its all-reduces finish after the others'
	CauseUnknown Cause = "unknown" // the phases do not say
)
