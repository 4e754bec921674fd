package rdzv

import (
	"crypto/rand"
	"encoding/hex"
)

// newRunID names one run of a job: the job's creation, or a new run of an
// ended job whose id is reused (torchrun's default "none"). Generations
// restart at 0 in a fresh store, so traces derived from the job id and
// the generation alone were the same for every run of a job id, and a
// trace viewer merged the runs' steps into one trace.
func newRunID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}
