package nodestack

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/modestest"
	"unbounded-cloud.io/agent/lib/readiness"
)

var dnsLayout = func() Layout {
	l := layout
	l.LocalDNSCorefile, l.PodResolvConf = "/etc/coredns/Corefile", "/etc/kubernetes/resolv.conf"
	return l
}()

// The ready endpoint readiness asks is on the cache's own address.
func TestTheReadyEndpointIsOnTheCachesHostAddress(t *testing.T) {
	if !strings.HasPrefix(readiness.LocalDNSReadyAddr, LocalDNSHostAddr+":") {
		t.Errorf("readiness asks %s, the cache listens on %s", readiness.LocalDNSReadyAddr, LocalDNSHostAddr)
	}
}

func TestParseResolvConfKeepsServersAndWhatPodsInherit(t *testing.T) {
	u := ParseResolvConf([]byte(`# from DHCP
nameserver 10.0.0.2
nameserver   fd00::53
nameserver 169.254.10.10
nameserver not-an-address
; comment
search corp.example lab.example
options ndots:2 timeout:1
sortlist 10.0.0.0/8
`))
	want := []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::53")}
	if !slices.Equal(u.Servers, want) {
		t.Errorf("servers %v, want %v (the cache's own address and a name left out)", u.Servers, want)
	}
	if !slices.Equal(u.Lines, []string{"search corp.example lab.example", "options ndots:2 timeout:1"}) {
		t.Errorf("lines %q", u.Lines)
	}
	if u := ParseResolvConf(nil); len(u.Servers) != 0 || len(u.Lines) != 0 {
		t.Errorf("empty: %+v", u)
	}
}

// serverBlocks splits a Corefile into its server blocks: the keys line
// (zones) and the directive lines of each, comments left out.
func serverBlocks(t *testing.T, corefile string) map[string][]string {
	t.Helper()
	blocks := map[string][]string{}
	var cur string
	depth := 0
	for _, line := range strings.Split(corefile, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		switch {
		case depth == 0 && strings.HasSuffix(line, "{"):
			cur = strings.TrimSpace(strings.TrimSuffix(line, "{"))
			if _, dup := blocks[cur]; dup {
				t.Fatalf("server block %q twice", cur)
			}
			blocks[cur] = nil
			depth = 1
		case line == "}":
			depth--
		default:
			if depth == 0 {
				t.Fatalf("%q outside any server block", line)
			}
			if strings.HasSuffix(line, "{") {
				depth++
			}
			blocks[cur] = append(blocks[cur], line)
		}
	}
	if depth != 0 {
		t.Fatalf("unbalanced braces:\n%s", corefile)
	}
	return blocks
}

func TestLocalDNSFilesForwardClusterNamesToTheClusterDNSAndTheRestToTheHostsResolvers(t *testing.T) {
	n := modestest.Node()
	n.LocalDNS, n.ClusterDNS, n.ClusterDomain = true, "10.96.0.10", "corp.cluster"
	up := ParseResolvConf([]byte("nameserver 10.0.0.2\nnameserver 10.0.0.3\nsearch corp.example\n"))
	m := byPath(t, LocalDNSFiles(n, dnsLayout, up))
	if len(m) != 3 {
		t.Fatalf("files %v, want the Corefile, the pods' resolv.conf and the link script", m)
	}
	blocks := serverBlocks(t, string(m[dnsLayout.LocalDNSCorefile].Data))
	cluster := blocks["corp.cluster:53 in-addr.arpa:53 ip6.arpa:53"]
	other := blocks[".:53"]
	if cluster == nil || other == nil || len(blocks) != 2 {
		t.Fatalf("server blocks %v, want the cluster domain's (with the reverse zones) and the root's", blocks)
	}
	for _, want := range []string{"bind 169.254.10.11", "forward . 10.96.0.10 {", "force_tcp", "serve_stale 1h", "success 9984 30"} {
		if !slices.Contains(cluster, want) {
			t.Errorf("cluster block lacks %q: %q", want, cluster)
		}
	}
	for _, want := range []string{"bind 169.254.10.10 169.254.10.11", "forward . 10.0.0.2 10.0.0.3", "loop", "serve_stale 1h", "ready " + "169.254.10.10:8181"} {
		if !slices.Contains(other, want) {
			t.Errorf("root block lacks %q: %q", want, other)
		}
	}
	rc := string(m[dnsLayout.PodResolvConf].Data)
	if !strings.Contains(rc, "\nnameserver 169.254.10.10\nsearch corp.example\n") || strings.Contains(rc, "10.0.0.2") {
		t.Errorf("pods' resolv.conf:\n%s", rc)
	}
	script := m["/usr/local/bin/"+LocalDNSLinkScript]
	if script.Mode != 0o755 || !strings.Contains(string(script.Data), "ip addr add 169.254.10.11/32 dev \"$dev\"") {
		t.Errorf("link script (mode %o):\n%s", script.Mode, script.Data)
	}

	// The kubelet's cluster DNS is the cache, pods with dnsPolicy Default
	// get its resolv.conf.
	kc := kubeletConfigOf(t, n, dnsLayout)
	if fmt.Sprint(kc["clusterDNS"]) != "[169.254.10.11]" || kc["resolvConf"] != dnsLayout.PodResolvConf {
		t.Errorf("kubelet: clusterDNS %v, resolvConf %v", kc["clusterDNS"], kc["resolvConf"])
	}
}

func TestLocalDNSWithoutHostResolversAnswersOnlyClusterNames(t *testing.T) {
	n := modestest.Node()
	n.LocalDNS = true
	blocks := serverBlocks(t, string(byPath(t, LocalDNSFiles(n, dnsLayout, Upstream{}))[dnsLayout.LocalDNSCorefile].Data))
	for _, l := range blocks[".:53"] {
		if strings.HasPrefix(l, "forward") || strings.HasPrefix(l, "cache") || l == "loop" || l == "errors" {
			t.Errorf("no host resolver, yet the root block has %q: a forward to nothing (CoreDNS refuses it), or errors logging every lookup", l)
		}
	}
	if !slices.Contains(blocks[".:53"], "ready 169.254.10.10:8181") {
		t.Errorf("the root block still says when the cache is ready: %q", blocks[".:53"])
	}
}

func TestWithoutLocalDNSTheKubeletAsksTheClusterDNS(t *testing.T) {
	n := modestest.Node()
	n.LocalDNS, n.ClusterDNS = false, "10.96.0.10"
	if f := LocalDNSFiles(n, dnsLayout, Upstream{}); f != nil {
		t.Errorf("files without the cache: %v", f)
	}
	kc := kubeletConfigOf(t, n, dnsLayout)
	if fmt.Sprint(kc["clusterDNS"]) != "[10.96.0.10]" || kc["resolvConf"] != dnsLayout.ResolvConf {
		t.Errorf("kubelet: clusterDNS %v, resolvConf %v", kc["clusterDNS"], kc["resolvConf"])
	}
}

// kubeletConfigOf is the KubeletConfiguration Files writes for n in l.
func kubeletConfigOf(t *testing.T, n modes.Node, l Layout) map[string]any {
	t.Helper()
	files, err := Files(n, l, Legacy)
	if err != nil {
		t.Fatal(err)
	}
	var kc map[string]any
	if err := yaml.Unmarshal(byPath(t, files)[l.KubeletConfig].Data, &kc); err != nil {
		t.Fatal(err)
	}
	return kc
}
