package detector_test

import (
	"context"
	"strings"
	"testing"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
	detectorv1 "github.com/ddp-agent/ddp-agent/plugins/detector/proto"
)

// rawServer sends findings as they are, as a plugin in another language
// could: the agent's side must refuse what it cannot read.
type rawServer struct {
	detectorv1.UnimplementedDetectorServer
	findings []*detectorv1.Finding
}

func (s *rawServer) Watch(_ *detectorv1.WatchRequest, stream grpc.ServerStreamingServer[detectorv1.Findings]) error {
	for _, f := range s.findings {
		if err := stream.Send(&detectorv1.Findings{Findings: []*detectorv1.Finding{f}}); err != nil {
			return err
		}
	}
	<-stream.Context().Done()
	return nil
}

func rawClient(t *testing.T, findings ...*detectorv1.Finding) detector.Detector {
	t.Helper()
	conn, srv := goplugin.TestGRPCConn(t, func(s *grpc.Server) {
		detectorv1.RegisterDetectorServer(s, &rawServer{findings: findings})
	})
	t.Cleanup(func() { _ = conn.Close(); srv.Stop() })
	raw, err := detector.Plugin{}.GRPCClient(context.Background(), nil, conn)
	if err != nil {
		t.Fatal(err)
	}
	return raw.(detector.Detector)
}

func TestClientRefusesWireValuesOutOfRange(t *testing.T) {
	ok := detectorv1.Severity_SEVERITY_OK
	none := detectorv1.Action_ACTION_NONE
	for _, tc := range []struct {
		name string
		f    *detectorv1.Finding
		want string
	}{
		{"severity unknown", &detectorv1.Finding{Severity: 42, Action: none}, "finding 2 refused: severity 42 unknown"},
		{"severity unset", &detectorv1.Finding{Action: none}, "finding 2 refused: severity not set"},
		{"action unknown", &detectorv1.Finding{Severity: ok, Action: 9}, "finding 2 refused: action 9 unknown"},
		{"action unset", &detectorv1.Finding{Severity: ok}, "finding 2 refused: action not set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good := &detectorv1.Finding{Subject: "node", Severity: ok, Action: none}
			d := rawClient(t, good, tc.f)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var n int
			err := d.Watch(ctx, func(detector.Finding) error { n++; return nil })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Watch = %v, want an error saying %q", err, tc.want)
			}
			if n != 1 {
				t.Errorf("emit called %d times, want 1 (the good finding)", n)
			}
		})
	}
}
