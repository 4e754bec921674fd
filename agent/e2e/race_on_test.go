//go:build race

package e2e

// raceEnabled: the tests run under -race, so the agent binary is built with
// it too and every end-to-end run also hunts data races in the real agent.
const raceEnabled = true
