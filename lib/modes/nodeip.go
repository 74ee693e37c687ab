package modes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// HostNet reads the host's routes and addresses, to give the node its
// address (Node.IPs): the kubelet then never looks its own name up in DNS
// (with no node IP it does, with no timeout, before its container manager
// starts, before it registers and at every status update). The node
// stacks of every mode share the host's network namespace, so the
// host's address is the node's. The zero value reads the real host.
type HostNet struct {
	// ProcNet is where route and ipv6_route are read ("" is /proc/net).
	ProcNet string
	// Addrs lists the addresses of the interface named, or of every
	// interface for "" (nil: the kernel's, through package net).
	Addrs func(iface string) ([]netip.Addr, error)
}

// NodeIPs is the Node's address: configured (node.ip, parsed by
// config.ParseNodeIPs), checked to be the host's; else the address of
// the interface of the default route, IPv4 first, else IPv6. A host
// without a default route gets none (nil, nil): the kubelet then finds
// one itself.
func (h HostNet) NodeIPs(configured []netip.Addr) ([]netip.Addr, error) {
	if len(configured) > 0 {
		all, err := h.addrs("")
		if err != nil {
			return nil, fmt.Errorf("list the host's addresses: %w", err)
		}
		for _, a := range configured {
			if !slices.Contains(all, a) {
				return nil, fmt.Errorf("%s is %w (it has %s)", a, ErrNotTheHosts, joinAddrs(all))
			}
		}
		return configured, nil
	}
	for _, v6 := range []bool{false, true} {
		iface, err := h.defaultRouteInterface(v6)
		if errors.Is(err, os.ErrNotExist) {
			continue // a kernel without this family
		}
		if err != nil {
			return nil, fmt.Errorf("read the host's default route: %w", err)
		}
		if iface == "" {
			continue
		}
		addrs, err := h.addrs(iface)
		if err != nil {
			return nil, fmt.Errorf("list the addresses of %s, the default route's interface: %w", iface, err)
		}
		for _, a := range addrs {
			if a.Is4() != v6 && a.IsGlobalUnicast() {
				return []netip.Addr{a}, nil
			}
		}
	}
	return nil, nil
}

// ErrNotTheHosts is wrapped by NodeIPs' error for a configured address
// that is not one of the host's: a configuration error (exit 78), unlike
// a host whose addresses cannot be read.
var ErrNotTheHosts = errors.New("not an address of this host")

func (h HostNet) addrs(iface string) ([]netip.Addr, error) {
	if h.Addrs != nil {
		return h.Addrs(iface)
	}
	var (
		as  []net.Addr
		err error
	)
	if iface == "" {
		as, err = net.InterfaceAddrs()
	} else {
		var i *net.Interface
		if i, err = net.InterfaceByName(iface); err == nil {
			as, err = i.Addrs()
		}
	}
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// defaultRouteInterface is the interface of the default route of the
// main table with the lowest metric ("" when there is none), from the
// kernel's text tables: /proc/net/route (Iface Destination Gateway Flags
// RefCnt Use Metric Mask ...) and /proc/net/ipv6_route (destination,
// prefix length, source, source length, next hop, metric, refcount, use,
// flags, interface).
func (h HostNet) defaultRouteInterface(v6 bool) (string, error) {
	dir := h.ProcNet
	if dir == "" {
		dir = "/proc/net"
	}
	name := "route"
	if v6 {
		name = "ipv6_route"
	}
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", err
	}
	const rtfUp, rtfReject = 0x1, 0x200
	best, bestMetric := "", uint64(1<<63)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var iface, flags string
		var metric uint64
		var err error
		switch {
		case !v6 && len(f) >= 8 && f[1] == "00000000" && f[7] == "00000000":
			// IPv4's metric is decimal, its flags hexadecimal.
			iface, flags = f[0], f[3]
			metric, err = strconv.ParseUint(f[6], 10, 64)
		case v6 && len(f) >= 10 && f[0] == strings.Repeat("0", 32) && f[1] == "00":
			iface, flags = f[9], f[8]
			metric, err = strconv.ParseUint(f[5], 16, 64)
		default:
			continue
		}
		fl, ferr := strconv.ParseUint(flags, 16, 32)
		if err != nil || ferr != nil || fl&rtfUp == 0 || fl&rtfReject != 0 || iface == "lo" {
			continue
		}
		if metric < bestMetric {
			best, bestMetric = iface, metric
		}
	}
	return best, sc.Err()
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}
