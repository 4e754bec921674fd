package main

import (
	"strings"

	"github.com/ddp-agent/ddp-agent/agent"
	"github.com/ddp-agent/ddp-agent/agent/launch"
	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/join"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// runConfig maps the parsed command line onto what the agent needs;
// getenv is the environment (the OTEL_* variables that decide the OTLP
// protocol).
func runConfig(cfg *launch.Config, getenv func(string) string) agent.Config {
	rc := cfg.Rdzv
	var tls *store.TLSFiles
	if rc.CACert != "" || rc.Cert != "" || rc.Protocol == "https" {
		tls = &store.TLSFiles{CertFile: rc.Cert, KeyFile: rc.Key, CAFile: rc.CACert}
	}
	return agent.Config{
		RunID:            cfg.RdzvID,
		Command:          cfg.Command(),
		NProcPerNode:     cfg.NProcPerNode,
		VirtualLocalRank: cfg.VirtualLocalRank,
		SignalsToHandle:  cfg.SignalsToHandle(),
		Role:             cfg.Role,
		MaxRestarts:      cfg.MaxRestarts,
		Spares:           cfg.Spares,
		SpareCommand:     spareCommand(cfg),
		StoreCommand:     storeCommand(cfg),
		StopTimeout:      cfg.StopTimeout,
		LogDir:           cfg.LogDir,
		KeepLogs:         cfg.KeepLogs(),
		Streams:          cfg.Streams(),
		Rendezvous: agent.Rendezvous{
			Backend:     rdzvBackend(cfg),
			Endpoints:   cfg.Endpoints(),
			IsHost:      rc.IsHost,
			TLS:         tls,
			NodeRank:    cfg.NodeRank,
			NNodesMin:   cfg.NNodesMin,
			NNodesMax:   cfg.NNodesMax,
			MasterAddr:  cfg.MasterAddr,
			MasterPort:  cfg.MasterPort,
			LocalAddr:   cfg.LocalAddr,
			Token:       rdzv.StretchToken(cfg.RdzvToken),
			Prefix:      rc.Prefix,
			JoinTimeout: rc.JoinTimeout,
			LastCall:    rc.LastCall,
			TTL:         rc.TTL(),
			StoreQuota:  rc.StoreQuota,
		},
		Plugins: agent.Plugins{Specs: cfg.Plugins, Dir: getenv(envname.PluginDir)},
		Telemetry: agent.Telemetry{
			Config: observe.Config{
				HangTimeout:   cfg.HangTimeout,
				HangAuto:      cfg.HangAuto,
				OTelEndpoint:  cfg.OTelEndpoint,
				OTLPProtocol:  otlpProtocol(cfg.OTelEndpoint, getenv),
				TraceSample:   cfg.TraceSample,
				MetricsAddr:   cfg.MetricsAddr,
				MetricsLinger: cfg.MetricsLinger,
				StragglerCost: cfg.StragglerCost,
				Version:       version,
			},
			// Parse checked the action against the same names.
			StragglerAction:  straggler.Action(cfg.StragglerAction),
			StragglerConfirm: cfg.StragglerConfirm,
		},
	}
}

// spareCommand is a warm spare's argv, nil without --spares.
func spareCommand(cfg *launch.Config) []string {
	if cfg.Spares == 0 {
		return nil
	}
	return cfg.SpareCommand()
}

// storeCommand is the argv of the workers' store's own process, nil
// without --spares: then rank 0's worker serves the store, as torchrun's
// rank 0 does under plain env://.
func storeCommand(cfg *launch.Config) []string {
	if cfg.Spares == 0 {
		return nil
	}
	return cfg.StoreCommand()
}

// rdzvBackend is the one place the flags choose the rendezvous backend:
// --standalone; static without a store (--rdzv-backend static, or no
// --rdzv-endpoint, which launch allows for one node only); an etcd of the
// user's (--rdzv-backend etcd); otherwise the store the job's agents host
// (c10d).
func rdzvBackend(cfg *launch.Config) join.Backend {
	switch {
	case cfg.Standalone:
		return join.Standalone
	case !cfg.Dynamic():
		return join.Static
	case cfg.ExternalStore():
		return join.External
	}
	return join.Hosted
}

// otlpProtocol: an http(s):// endpoint means OTLP/HTTP, as the flag's
// help says, unless the standard variables ask for gRPC; "" leaves the
// choice to those variables.
func otlpProtocol(endpoint string, getenv func(string) string) string {
	if !strings.HasPrefix(endpoint, "http://") && !strings.HasPrefix(endpoint, "https://") {
		return ""
	}
	if getenv("OTEL_EXPORTER_OTLP_PROTOCOL") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") != "" {
		return ""
	}
	return export.ProtocolHTTP
}
