package observability

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// jaegerAPI is Jaeger's query API (the HTTP JSON API its UI reads) at base,
// e.g. http://127.0.0.1:16686.
type jaegerAPI struct{ base string }

// jaegerTrace is one trace as /api/traces returns it.
type jaegerTrace struct {
	TraceID   string                   `json:"traceID"`
	Spans     []jaegerSpan             `json:"spans"`
	Processes map[string]jaegerProcess `json:"processes"`
}

type jaegerSpan struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []jaegerRef `json:"references"`
	StartTime     int64       `json:"startTime"` // µs since the epoch
	Duration      int64       `json:"duration"`  // µs
	Tags          []jaegerTag `json:"tags"`
	ProcessID     string      `json:"processID"`
}

type jaegerRef struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

type jaegerTag struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

type jaegerProcess struct {
	ServiceName string      `json:"serviceName"`
	Tags        []jaegerTag `json:"tags"`
}

func tag(tags []jaegerTag, key string) (any, bool) {
	for _, t := range tags {
		if t.Key == key {
			return t.Value, true
		}
	}
	return nil, false
}

// intTag is tag key as an integer (Jaeger's JSON has int64 tags as
// numbers); ok is false when it is missing or not a number.
func intTag(tags []jaegerTag, key string) (int64, bool) {
	v, ok := tag(tags, key)
	if !ok {
		return 0, false
	}
	switch v := v.(type) {
	case float64:
		return int64(v), true
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// get GETs path (with query) and decodes the "data" member of the answer.
func (j jaegerAPI) get(ctx context.Context, path string, data any) error {
	code, body, err := httpGet(ctx, j.base+path)
	if err != nil {
		return fmt.Errorf("jaeger %s: %w", path, err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("jaeger %s: %d %.300s", path, code, body)
	}
	var resp struct {
		Data   json.RawMessage `json:"data"`
		Errors []any           `json:"errors"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("jaeger %s: %w", path, err)
	}
	if len(resp.Errors) > 0 {
		return fmt.Errorf("jaeger %s: errors %v", path, resp.Errors)
	}
	if err := json.Unmarshal(resp.Data, data); err != nil {
		return fmt.Errorf("jaeger %s data: %w", path, err)
	}
	return nil
}

func (j jaegerAPI) services(ctx context.Context) ([]string, error) {
	var s []string
	err := j.get(ctx, "/api/services", &s)
	return s, err
}

func (j jaegerAPI) operations(ctx context.Context, service string) ([]string, error) {
	var s []string
	err := j.get(ctx, "/api/services/"+url.PathEscape(service)+"/operations", &s)
	return s, err
}

// traces finds up to limit traces of the last hour with a span of service
// (and operation, unless ""), each whole.
func (j jaegerAPI) traces(ctx context.Context, service, operation string, limit int) ([]jaegerTrace, error) {
	q := url.Values{}
	q.Set("service", service)
	if operation != "" {
		q.Set("operation", operation)
	}
	now := time.Now()
	q.Set("start", strconv.FormatInt(now.Add(-time.Hour).UnixMicro(), 10))
	q.Set("end", strconv.FormatInt(now.Add(time.Minute).UnixMicro(), 10))
	q.Set("limit", strconv.Itoa(limit))
	var ts []jaegerTrace
	err := j.get(ctx, "/api/traces?"+q.Encode(), &ts)
	return ts, err
}
