// Package k8s holds the Kubernetes manifests for ddp-agent (launcher.yaml,
// sidecar.yaml, etcd.yaml; README.md says which fits which site) and their
// test. No cluster runs here: the test decodes every manifest strictly into
// the k8s.io/api types, checks the invariants a cluster would only reveal at
// run time (names that must agree, exit codes, grace periods, probes, the
// socket the sidecar shares), and parses every ddp-agent command line in them
// with the agent's own flag parser.
package k8s
