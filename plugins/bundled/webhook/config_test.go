package webhook

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
)

func TestConfigure(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  plugins.Config
		want config // checked when err is ""
		err  string
	}{
		{"defaults", plugins.Config{"url": "https://hooks.example.com/services/T0/B0/XYZ"},
			config{url: "https://hooks.example.com/services/T0/B0/XYZ", redacted: "https://hooks.example.com/…", timeout: 5 * time.Second, retries: 3}, ""},
		{"all", plugins.Config{"url": "http://10.0.0.1:8080", "secret": "s3", "timeout": "1s", "retries": "0", "header": "authorization:  Bearer abc "},
			config{url: "http://10.0.0.1:8080", redacted: "http://10.0.0.1:8080", secret: "s3", timeout: time.Second, header: [2]string{"Authorization", "Bearer abc"}}, ""},
		{"no url", plugins.Config{}, config{}, `option "url" is required`},
		{"not http", plugins.Config{"url": "ftp://x/y"}, config{}, `option url: scheme "ftp": want http or https`},
		{"no host", plugins.Config{"url": "https:///path"}, config{}, "option url: no host"},
		{"bad url, not quoted", plugins.Config{"url": "https://h/%zz-token"}, config{}, "option url: not a URL"},
		{"bad timeout", plugins.Config{"url": "https://h", "timeout": "5"}, config{}, `option timeout: "5" is not a duration`},
		{"bad retries", plugins.Config{"url": "https://h", "retries": "many"}, config{}, `option retries: "many" is not a whole number from 0 to 10`},
		{"too many retries", plugins.Config{"url": "https://h", "retries": "11"}, config{}, "option retries"},
		{"bad header", plugins.Config{"url": "https://h", "header": "no colon"}, config{}, `option header: want "Name: value"`},
		{"bad header name", plugins.Config{"url": "https://h", "header": "X Y: z"}, config{}, "option header"},
		{"reserved header", plugins.Config{"url": "https://h", "header": "x-ddp-agent-signature: forged"}, config{}, "option header: X-DDP-Agent-Signature is set by the plugin"},
		{"unknown option", plugins.Config{"url": "https://h", "token": "x"}, config{}, `unknown option "token"`},
	} {
		n := New().(*Notifier)
		err := n.Configure(context.Background(), tc.cfg)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "token") && tc.name != "unknown option" {
				t.Errorf("%s: the error quotes the URL: %v", tc.name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got := *n.cfg.Load(); got != tc.want {
			t.Errorf("%s: config %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestInfo(t *testing.T) {
	info, err := New().Info(context.Background())
	if err != nil || info.Name != "webhook" || info.Kind != plugins.KindNotifier || info.Version != "0.1.0" || info.Summary == "" {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	for _, o := range info.Options {
		if o.Help == "" {
			t.Errorf("option %s has no help", o.Name)
		}
	}
}
