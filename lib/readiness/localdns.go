package readiness

import "context"

// LocalDNSReadyAddr is where the node-local DNS cache (lib/modes/nodestack's
// Corefile: CoreDNS's ready plugin) says whether it serves, on the cache's
// own link-local address, which the host reaches in every mode (the node
// stack runs in the host's network namespace).
const LocalDNSReadyAddr = "169.254.10.10:8181"

// LocalDNSReady asks the node-local DNS cache's ready endpoint at addr and
// returns nil when it answers 200 "OK": every server block of its Corefile
// is up.
func LocalDNSReady(ctx context.Context, addr string) error {
	return probe(ctx, addr, "/ready", "OK")
}
