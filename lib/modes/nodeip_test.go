package modes

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The kernel's tables as /proc/net shows them: a default route on eth1
// (metric 100) and a better one on eth0 (metric 0); a reject route on lo.
const (
	route4 = `Iface	Destination	Gateway 	Flags	RefCnt	Use	Metric	Mask		MTU	Window	IRTT
eth1	00000000	010200C0	0003	0	0	100	00000000	0	0	0
eth0	00000000	0164A8C0	0003	0	0	0	00000000	0	0	0
eth0	0064A8C0	00000000	0001	0	0	0	00FFFFFF	0	0	0
`
	route6 = `fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth2
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth2
`
)

func fakeNet(t *testing.T, v4, v6 string, addrs map[string][]string) HostNet {
	dir := t.TempDir()
	for name, data := range map[string]string{"route": v4, "ipv6_route": v6} {
		if data != "" {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return HostNet{ProcNet: dir, Addrs: func(iface string) ([]netip.Addr, error) {
		var out []netip.Addr
		for name, as := range addrs {
			if iface != "" && name != iface {
				continue
			}
			for _, a := range as {
				out = append(out, netip.MustParseAddr(a))
			}
		}
		slices.SortFunc(out, netip.Addr.Compare)
		return out, nil
	}}
}

func TestNodeIPIsTheAddressOfTheDefaultRoutesInterfaceIPv4First(t *testing.T) {
	addrs := map[string][]string{
		"lo":   {"127.0.0.1", "::1"},
		"eth0": {"fe80::1", "192.168.100.7"},
		"eth1": {"192.0.2.10"},
		"eth2": {"fe80::2", "fd00::7"},
	}
	for _, tc := range []struct {
		name, v4, v6 string
		want         string
	}{
		{"the lowest metric of two IPv4 default routes", route4, route6, "[192.168.100.7]"},
		{"IPv6 only: its global address, not the link-local one", "", route6, "[fd00::7]"},
		{"no default route: none (the kubelet finds one)", "Iface\tDestination\n", "", "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ips, err := fakeNet(t, tc.v4, tc.v6, addrs).NodeIPs(nil)
			if got := fmtAddrs(ips); err != nil || got != tc.want {
				t.Errorf("NodeIPs = %s, %v; want %s", got, err, tc.want)
			}
		})
	}
}

func TestAConfiguredNodeIPMustBeAnAddressOfTheHost(t *testing.T) {
	h := fakeNet(t, route4, route6, map[string][]string{"eth0": {"192.168.100.7"}, "eth2": {"fd00::7"}})
	want := []netip.Addr{netip.MustParseAddr("192.168.100.7"), netip.MustParseAddr("fd00::7")}
	if ips, err := h.NodeIPs(want); err != nil || !slices.Equal(ips, want) {
		t.Errorf("dual-stack node.ip of the host: %v, %v", ips, err)
	}
	_, err := h.NodeIPs([]netip.Addr{netip.MustParseAddr("192.0.2.99")})
	if err == nil || !strings.Contains(err.Error(), "192.0.2.99 is not an address of this host (it has 192.168.100.7, fd00::7)") {
		t.Errorf("a foreign node.ip: %v", err)
	}
}

func fmtAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}

// A host whose addresses cannot be read (a sandbox without netlink) is an
// error, never a silent "no address": the kubelet would then look its own
// name up. A kernel without IPv6 routes is not an error.
func TestNodeIPOfAHostWhoseAddressesCannotBeReadIsAnError(t *testing.T) {
	h := fakeNet(t, route4, "", nil)
	h.Addrs = func(string) ([]netip.Addr, error) { return nil, errors.New("address family not supported by protocol") }
	if ips, err := h.NodeIPs(nil); err == nil || !strings.Contains(err.Error(), "eth0") {
		t.Errorf("NodeIPs with unreadable addresses = %v, %v; want an error naming the interface", ips, err)
	}
	if _, err := h.NodeIPs([]netip.Addr{netip.MustParseAddr("192.0.2.10")}); err == nil || errors.Is(err, ErrNotTheHosts) {
		t.Errorf("a configured address on a host whose addresses cannot be read: %v, want an error that is not ErrNotTheHosts", err)
	}
	h = fakeNet(t, route4, "", map[string][]string{"eth0": {"192.168.100.7"}})
	if ips, err := h.NodeIPs(nil); err != nil || fmtAddrs(ips) != "[192.168.100.7]" {
		t.Errorf("without ipv6_route: %v, %v", ips, err)
	}
}
