package nodestack

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"path"
	"strings"

	"github.com/coreos/go-systemd/v22/unit"

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
// CoreDNS starts (LocalDNSLinkUp), and LocalDNSLinkDown after it stops.
const LocalDNSLinkScript = "unbounded-dns-link"

// LocalDNSLinkUp is the cache's unit's ExecStartPre=: the interface script
// of the node stack's binDir. "+": it runs as root with every privilege,
// outside the sandbox of the server (LocalDNSSandbox), since creating an
// interface and its addresses needs CAP_NET_ADMIN, which the server never
// gets.
func LocalDNSLinkUp(binDir string) string { return "+" + path.Join(binDir, LocalDNSLinkScript) }

// LocalDNSLinkDown is the cache's unit's ExecStopPost=: the interface
// removed after every end of the cache (a stop, a crash, a kill), by the
// host's ip, not by a file of the node stack's version: in mode none a
// repave may have flipped the version (to one without the cache) by the
// time the old cache stops. "-": there may be none to remove; "+": as
// root with every privilege (CAP_NET_ADMIN), as LocalDNSLinkUp.
const LocalDNSLinkDown = "-+ip link del " + LocalDNSInterface

// LocalDNSService is the [Service] section of the cache's unit in every
// mode, for the node stack's layout l: CoreDNS with l's Corefile, its
// interface made before (as root) and removed after, restarted whenever
// it ends, in the sandbox of LocalDNSSandbox. The nspawn and container
// modes write it into the node (lib/modes/bluegreen/tree); mode none's shipped
// units/unbounded-local-dns.service holds the same settings (its test
// compares them).
func LocalDNSService(l Layout) []*unit.UnitOption {
	s := func(name, value string) *unit.UnitOption { return unit.NewUnitOption("Service", name, value) }
	return append([]*unit.UnitOption{
		// CoreDNS does not speak sd_notify: started is exec'd. Its
		// readiness (the ready plugin's endpoint) is what the node's
		// health checks count.
		s("Type", "exec"),
		s("ExecStartPre", LocalDNSLinkUp(l.BinDir)),
		s("ExecStart", path.Join(l.BinDir, "coredns")+" -conf "+l.LocalDNSCorefile),
		s("ExecStopPost", LocalDNSLinkDown),
		s("Restart", "always"),
		s("RestartSec", "1s"),
	}, LocalDNSSandbox()...)
}

// LocalDNSSandbox is the sandbox of the cache's server in every mode: a
// network-facing DNS server that needs only its listen addresses (port
// 53 on the two addresses of LocalDNSInterface, and the ready endpoint),
// its Corefile and the network to its upstreams. Measured by
// `systemd-analyze security` in the lint tier (units/security_test.go:
// mode none's shipped unit and the node's, at most 2.5).
//
// What remains, and why:
//   - CAP_NET_BIND_SERVICE (ambient, and the only one in the bounding set):
//     port 53 is below 1024. No other capability: the interface is made
//     and removed by the "+" commands (LocalDNSLinkUp, LocalDNSLinkDown).
//   - The host's network (no PrivateNetwork=, no IPAddressDeny=): pods and
//     the host ask it on the host's link-local addresses, and it forwards
//     to the cluster DNS and the host's resolvers, wherever they are.
//   - No PrivateUsers=: a capability in a user namespace of its own does
//     not count for the host's network namespace, where port 53 is bound.
//   - AF_INET and AF_INET6 only: DNS over UDP and TCP and the ready
//     endpoint. No AF_UNIX (its log is the standard output systemd hands
//     it, an open socket; it speaks neither sd_notify nor syslog), no
//     AF_NETLINK: the bind plugin lists the interfaces at every start to
//     resolve an interface name, finds the list refused and logs a
//     warning, "failed to get interfaces list, cannot bind by interface
//     name"; the Corefile binds addresses, never names.
//
// Nothing is writable: CoreDNS keeps its cache in memory and writes no
// file (no StateDirectory=, no RuntimeDirectory=). The Corefile is 0644
// (LocalDNSFiles: it holds no secret), the executable 0755.
func LocalDNSSandbox() []*unit.UnitOption {
	s := func(name, value string) *unit.UnitOption { return unit.NewUnitOption("Service", name, value) }
	return []*unit.UnitOption{
		// A user of its own, allocated at every start and never owning a
		// file (it implies ProtectSystem=strict, PrivateTmp=,
		// RemoveIPC=, NoNewPrivileges= and RestrictSUIDSGID=, also set
		// below where the analyzer counts them).
		s("DynamicUser", "yes"),
		s("AmbientCapabilities", "CAP_NET_BIND_SERVICE"),
		s("CapabilityBoundingSet", "CAP_NET_BIND_SERVICE"),
		s("NoNewPrivileges", "yes"),
		s("ProtectSystem", "strict"),
		// Under systemd 252 /run stays writable with ProtectSystem=strict
		// when ProtectKernelTunables=, ProtectControlGroups=,
		// ProtectProc= or ProcSubset= is set as well (as for the agent's
		// units; tests/system/sandbox_test.go).
		s("ReadOnlyPaths", "/run"),
		s("ProtectHome", "yes"),
		s("PrivateTmp", "yes"),
		s("PrivateMounts", "yes"),
		s("PrivateDevices", "yes"),
		s("DevicePolicy", "closed"),
		s("ProtectKernelTunables", "yes"),
		s("ProtectKernelModules", "yes"),
		s("ProtectKernelLogs", "yes"),
		s("ProtectControlGroups", "yes"),
		s("ProtectClock", "yes"),
		s("ProtectHostname", "yes"),
		s("ProtectProc", "invisible"),
		// Go reads /proc/sys/net/core/somaxconn for its listen backlog;
		// without it, its default (the kernel caps both alike).
		s("ProcSubset", "pid"),
		s("RestrictNamespaces", "yes"),
		s("RestrictRealtime", "yes"),
		s("RestrictSUIDSGID", "yes"),
		s("LockPersonality", "yes"),
		// Go maps no memory writable and executable.
		s("MemoryDenyWriteExecute", "yes"),
		s("RestrictAddressFamilies", "AF_INET AF_INET6"),
		s("SystemCallArchitectures", "native"),
		s("SystemCallFilter", "@system-service"),
		s("SystemCallFilter", "~@privileged @resources"),
		s("SystemCallErrorNumber", "EPERM"),
		s("UMask", "0077"),
	}
}

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
