package rdzv

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"

	"golang.org/x/crypto/argon2"
)

// The job's token (--rdzv-token) is the one secret the agents share: the
// store's certificate authority, the join check and the telemetry relay's
// secret are all derived from it. Each derived value is something an
// outsider can see (every store member shows a leaf signed by the CA to
// anyone who connects), so each is an offline oracle for the token: with
// one HMAC between them, "hunter2" fell in 60 s on one core. So the token
// is stretched first, once per agent, with Argon2id (RFC 9106's second
// recommended setting: 3 passes over 64 MiB, 4 lanes; about 0.2 s), and
// a token shorter than MinTokenLen is refused: a stretched word from a
// list still falls to a list.

// MinTokenLen is the shortest --rdzv-token an agent accepts.
const MinTokenLen = 16

// tokenSalt is fixed: the job id is not known to every user of the token
// (ddp-agent status lists a store's jobs before it picks one), and a
// change of the scheme changes the salt, so agents of two schemes refuse
// each other instead of half-agreeing.
const tokenSalt = "ddp-agent rdzv token v2"

// CheckToken refuses a token too short to stand an offline guess ("" is
// no token, which the caller allows or not).
func CheckToken(token string) error {
	if token != "" && len(token) < MinTokenLen {
		return fmt.Errorf("--rdzv-token: %d characters can be guessed offline by anyone who reaches the store's port; "+
			"use %d or more (ddp-agent token prints a random one)", len(token), MinTokenLen)
	}
	return nil
}

// StretchToken is the secret derived from token that every other use of
// it starts from, as hex; "" for "".
func StretchToken(token string) string {
	if token == "" {
		return ""
	}
	return hex.EncodeToString(argon2.IDKey([]byte(token), []byte(tokenSalt), 3, 64<<10, 4, 32))
}

// NewToken returns a random token of 256 bits, URL-safe base64.
func NewToken() string {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}
