package webhook

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/bundled/internal/opts"
)

const (
	defaultTimeout = "5s"
	defaultRetries = "3"
	maxRetries     = 10
)

// config is the checked options.
type config struct {
	url      string
	redacted string // scheme://host/…: for messages, since a chat webhook's path is its secret
	secret   string
	timeout  time.Duration
	retries  int
	header   [2]string // name, value; name "" when none
}

// parseConfig checks every option's value. No message quotes the URL's
// path, the secret or the header's value: they are credentials, and
// errors end up in logs.
func parseConfig(cfg plugins.Config) (config, error) {
	var c config
	var err error
	if c.url, c.redacted, err = parseURL(cfg.Get("url", "")); err != nil {
		return config{}, fmt.Errorf("option url: %w", err)
	}
	c.secret = cfg.Get("secret", "")
	if c.timeout, err = opts.Duration(cfg, "timeout", defaultTimeout); err != nil {
		return config{}, err
	}
	v := cfg.Get("retries", defaultRetries)
	if c.retries, err = strconv.Atoi(v); err != nil || c.retries < 0 || c.retries > maxRetries {
		return config{}, fmt.Errorf("option retries: %q is not a whole number from 0 to %d", v, maxRetries)
	}
	if h := cfg.Get("header", ""); h != "" {
		if c.header, err = parseHeader(h); err != nil {
			return config{}, fmt.Errorf("option header: %w", err)
		}
	}
	return c, nil
}

func parseURL(s string) (full, redacted string, err error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", "", errors.New("not a URL") // url's own error quotes it whole
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", "", fmt.Errorf("scheme %q: want http or https", u.Scheme)
	}
	if u.Host == "" {
		return "", "", errors.New("no host")
	}
	redacted = u.Scheme + "://" + u.Host
	if u.Path != "" || u.RawQuery != "" {
		redacted += "/…"
	}
	return u.String(), redacted, nil
}

// reserved are headers the plugin sets itself: one from the header
// option would make the body or its signature ambiguous.
var reserved = []string{"Content-Type", "Content-Length", "Host", hdrSignature, hdrTimestamp, hdrDelivery, hdrEvent}

// parseHeader reads "Name: value".
func parseHeader(s string) ([2]string, error) {
	name, value, ok := strings.Cut(s, ":")
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	if !ok || !validToken(name) {
		return [2]string{}, errors.New(`want "Name: value", with a name of letters, digits and -`)
	}
	if strings.ContainsAny(value, "\r\n\x00") {
		return [2]string{}, fmt.Errorf("the value of %s has a line break", name)
	}
	for _, r := range reserved {
		if http.CanonicalHeaderKey(name) == http.CanonicalHeaderKey(r) {
			return [2]string{}, fmt.Errorf("%s is set by the plugin", r)
		}
	}
	return [2]string{http.CanonicalHeaderKey(name), value}, nil
}

// validToken is RFC 9110's token, what a header's name may be.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)
		if !ok {
			return false
		}
	}
	return true
}
