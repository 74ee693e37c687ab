package nodestack

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"path"
	"strings"

	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/readiness"
)

// The node-local DNS cache (node.local-dns): CoreDNS on two link-local
// addresses of an interface of its own, in the network namespace the node
// stack shares with the host (both modes).
//
// Pods with the default dnsPolicy (ClusterFirst) ask LocalDNSClusterAddr,
// the kubelet's clusterDNS: names of the cluster domain and reverse
// lookups are forwarded to the cluster DNS ([cluster] cluster-dns), every
// other name straight to the host's resolvers. Pods with dnsPolicy Default
// get LocalDNSHostAddr, the host's resolvers only. The address is local to
// the host, so a pod's query is delivered, not forwarded or translated:
// no conntrack NAT entry, and so none of the races of DNAT'd UDP queries
// to a Service address that node-local DNS caches exist to avoid (no
// NOTRACK rules are needed, and none are written).
const (
	LocalDNSInterface   = "unbounded-dns0"
	LocalDNSHostAddr    = "169.254.10.10"
	LocalDNSClusterAddr = "169.254.10.11"
)

// LocalDNSUnitDescription is the description of the cache's unit in every
// mode.
const LocalDNSUnitDescription = "node-local DNS cache (unbounded node stack)"

// LocalDNSLinkScript is the script that creates the cache's interface, a
// file of the node stack's BinDir; the cache's unit runs it before
// CoreDNS starts, and LocalDNSLinkDown after it stops.
const LocalDNSLinkScript = "unbounded-dns-link"

// LocalDNSLinkDown is the cache's unit's ExecStopPost=: the interface
// removed after every end of the cache (a stop, a crash, a kill), by the
// host's ip, not by a file of the node stack's version: in mode none a
// repave may have flipped the version (to one without the cache) by the
// time the old cache stops. "-": there may be none to remove.
const LocalDNSLinkDown = "-ip link del " + LocalDNSInterface

// localDNSLinkScript uses iproute2's ip, which the node's OS has (the
// host's in mode none, the node image's in nspawn).
const localDNSLinkScript = `#!/bin/sh
# Written by unbounded-agent: the interface of the node-local DNS cache,
# made anew before the cache starts, holding its two addresses. A leftover
# (a machine killed before its unit's stop removed it) is removed first.
set -eu
dev=` + LocalDNSInterface + `
ip link del "$dev" 2>/dev/null || true
# A dummy interface; a kernel built without the dummy driver gets an empty
# bridge, which holds local addresses alike (no port, no traffic of its
# own).
ip link add "$dev" type dummy 2>/dev/null || ip link add "$dev" type bridge
ip addr add ` + LocalDNSHostAddr + `/32 dev "$dev"
ip addr add ` + LocalDNSClusterAddr + `/32 dev "$dev"
ip link set "$dev" up
`

// LocalDNSCacheTTL caps how long an answer is kept (CoreDNS's cache
// "success" and "denial" TTL); LocalDNSServeStale is how long an expired
// one is still served while the server behind gives no answer.
const (
	LocalDNSCacheTTL   = 30
	LocalDNSServeStale = "1h"
)

// Upstream is what the node's resolv.conf (the host's, at prepare) says:
// its nameservers and the lines pods inherit (search, options).
type Upstream struct {
	Servers []netip.Addr
	// Lines are its search and options lines, as written.
	Lines []string
}

// ParseResolvConf reads a resolv.conf. Nameservers that are the cache's
// own addresses are left out (a host whose resolv.conf names the cache
// would forward to itself), and so is anything not an address.
func ParseResolvConf(data []byte) Upstream {
	var u Upstream
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") || strings.HasPrefix(f[0], ";") {
			continue
		}
		switch f[0] {
		case "nameserver":
			if len(f) < 2 {
				continue
			}
			a, err := netip.ParseAddr(f[1])
			if err != nil || a.String() == LocalDNSHostAddr || a.String() == LocalDNSClusterAddr {
				continue
			}
			u.Servers = append(u.Servers, a)
		case "search", "domain", "options":
			u.Lines = append(u.Lines, line)
		}
	}
	return u
}

// LocalDNSFiles are the cache's files for n in layout l, given the
// host's resolvers up: the Corefile, the resolv.conf of pods with
// dnsPolicy Default (l.PodResolvConf, the kubelet's resolvConf), and the
// interface script. None when n.LocalDNS is off.
func LocalDNSFiles(n modes.Node, l Layout, up Upstream) []File {
	if !n.LocalDNS {
		return nil
	}
	var rc strings.Builder
	rc.WriteString("# Written by unbounded-agent at prepare: pods with dnsPolicy Default ask the\n")
	rc.WriteString("# node-local DNS cache, which asks the host's resolvers.\n")
	fmt.Fprintf(&rc, "nameserver %s\n", LocalDNSHostAddr)
	for _, line := range up.Lines {
		rc.WriteString(line + "\n")
	}
	return []File{
		{Path: l.LocalDNSCorefile, Mode: 0o644, Data: corefile(n, up)},
		{Path: l.PodResolvConf, Mode: 0o644, Data: []byte(rc.String())},
		{Path: path.Join(l.BinDir, LocalDNSLinkScript), Mode: 0o755, Data: []byte(localDNSLinkScript)},
	}
}

// corefile is CoreDNS's configuration of the cache.
func corefile(n modes.Node, up Upstream) []byte {
	domain := n.ClusterDomain
	if domain == "" {
		domain = "cluster.local"
	}
	cache := fmt.Sprintf(`    cache %d {
        success 9984 %[1]d
        denial 9984 5
        serve_stale %s
    }
`, LocalDNSCacheTTL, LocalDNSServeStale)
	var b strings.Builder
	b.WriteString(`# Written by unbounded-agent at prepare: the node-local DNS cache
# (node.local-dns). Regenerated at every prepare, so edits here do not last.
`)
	if n.ClusterDNS != "" {
		fmt.Fprintf(&b, `
# The cluster's names and reverse lookups, asked by pods at %[1]s (the
# kubelet's clusterDNS): forwarded to the cluster DNS over TCP (one
# connection reused, no UDP conntrack entry per query).
%[2]s:53 in-addr.arpa:53 ip6.arpa:53 {
    bind %[1]s
    errors
%[3]s    forward . %[4]s {
        force_tcp
    }
}
`, LocalDNSClusterAddr, domain, cache, n.ClusterDNS)
	}
	fmt.Fprintf(&b, `
# Every other name, asked at %[1]s (pods with dnsPolicy Default) and at
# %[2]s: the host's resolvers, as its resolv.conf named them at prepare.
.:53 {
    bind %[1]s %[2]s
`, LocalDNSHostAddr, LocalDNSClusterAddr)
	if len(up.Servers) > 0 {
		servers := make([]string, len(up.Servers))
		for i, a := range up.Servers {
			servers[i] = a.String()
		}
		b.WriteString("    errors\n" + cache)
		fmt.Fprintf(&b, "    forward . %s\n", strings.Join(servers, " "))
		b.WriteString("    # A resolver that forwards back here would loop: CoreDNS stops (and\n    # systemd restarts it) instead.\n    loop\n")
	} else {
		// No errors plugin: it would log every such lookup.
		b.WriteString("    # The host named no resolver at prepare: these names get SERVFAIL.\n")
	}
	fmt.Fprintf(&b, `    # 200 "OK" once every server block serves: the node's health checks it.
    ready %s
}
`, readiness.LocalDNSReadyAddr)
	return []byte(b.String())
}
