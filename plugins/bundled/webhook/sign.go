package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// The headers each POST carries.
const (
	// hdrTimestamp is the try's time, Unix seconds, always sent. It is
	// signed with the body, so a receiver that refuses old timestamps
	// refuses a replayed POST.
	hdrTimestamp = "X-DDP-Agent-Timestamp"
	// hdrSignature is "sha256=" + sign(secret, timestamp, body), sent
	// when the secret option is set.
	hdrSignature = "X-DDP-Agent-Signature"
	// hdrDelivery is the same on every try of one event, for a receiver
	// to drop the repeats a retry after a lost answer makes.
	hdrDelivery = "X-DDP-Agent-Delivery"
	// hdrEvent is the event's kind, for routing without reading the body.
	hdrEvent = "X-DDP-Agent-Event"
)

// sign is the hex HMAC-SHA256, keyed by secret, of the timestamp header's
// value, a ".", and the body's bytes as sent.
func sign(secret, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}
