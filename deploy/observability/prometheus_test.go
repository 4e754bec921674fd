package observability

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
)

// promAPI is Prometheus's HTTP API at base, e.g. http://127.0.0.1:9090.
type promAPI struct{ base string }

// promSample is one element of an instant vector.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"` // [unix time, "value"]
}

func (s promSample) value() string {
	v, _ := s.Value[1].(string)
	return v
}

func (p promAPI) get(ctx context.Context, path string, data any) error {
	code, body, err := httpGet(ctx, p.base+path)
	if err != nil {
		return fmt.Errorf("prometheus %s: %w", path, err)
	}
	var resp struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("prometheus %s: %d %.300s", path, code, body)
	}
	if code != http.StatusOK || resp.Status != "success" {
		return fmt.Errorf("prometheus %s: %d %s: %s", path, code, resp.Status, resp.Error)
	}
	return json.Unmarshal(resp.Data, data)
}

// query evaluates expr now and returns its vector; an expression whose
// result is not an instant vector is an error.
func (p promAPI) query(ctx context.Context, expr string) ([]promSample, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query?query="+url.QueryEscape(expr), &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: result type %s, want vector", expr, data.ResultType)
	}
	var v []promSample
	err := json.Unmarshal(data.Result, &v)
	return v, err
}

// promRule is a rule as /api/v1/rules reports it.
type promRule struct {
	Name      string `json:"name"`
	Type      string `json:"type"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	State     string `json:"state"` // alerting rules: inactive, pending, firing
	Alerts    []struct {
		Labels map[string]string `json:"labels"`
		State  string            `json:"state"`
	} `json:"alerts"`
}

func (p promAPI) rules(ctx context.Context) ([]promRule, error) {
	var data struct {
		Groups []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get(ctx, "/api/v1/rules", &data); err != nil {
		return nil, err
	}
	var rs []promRule
	for _, g := range data.Groups {
		rs = append(rs, g.Rules...)
	}
	return rs, nil
}
