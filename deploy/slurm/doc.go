// Package slurm holds no code: its directory is ddp-agent's Slurm
// deployment (ddp-agent.sbatch, sidecar.sbatch, prolog.sh, epilog.sh; see
// README.md), and its test runs them on a real Slurm (slurm_test.go).
package slurm
