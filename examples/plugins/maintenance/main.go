// Command maintenance is an example ddp-agent plugin, written as a site
// would write its own against the SDK (docs/plugin-sdk.md): a detector
// that drains the node while a maintenance file exists, so an operator
// can take a node out of a running job with
//
//	echo "BIOS update, ticket 4711" > /etc/ddp-agent/maintenance
//
// Build it and hand its path to the agent:
//
//	go build -o /opt/site/maintenance ./examples/plugins/maintenance
//	ddp-agent run --plugin /opt/site/maintenance,file=/run/drain-me ...
package main

import "github.com/ddp-agent/ddp-agent/plugins/detector"

func main() {
	detector.Serve(&maintenance{})
}
