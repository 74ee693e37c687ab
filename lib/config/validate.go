package config

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
	"k8s.io/apimachinery/pkg/util/validation"

	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/privilege"
)

var (
	// bootstrapTokenRE is the Kubernetes bootstrap token format
	// (token-id.token-secret), as kube-apiserver accepts it.
	bootstrapTokenRE = regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`)
	// versionRE is a semantic version, with the "v" Kubernetes release
	// tags carry allowed.
	versionRE  = regexp.MustCompile(`^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	uuidRE     = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	sha256RE   = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
	artifactRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
	// imageRefRE is the shape of an OCI image reference: a lowercase
	// repository path (with an optional registry host:port) and a tag
	// and/or a digest. The registry has the last word; this catches typos
	// and spaces before anything is pulled.
	imageRefRE    = regexp.MustCompile(`^[a-z0-9]+([._:/-]+[a-z0-9]+)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$`)
	logLevels     = []string{"debug", "info", "warn", "error"}
	taintEffects  = []string{"NoSchedule", "PreferNoSchedule", "NoExecute"}
	minFenceRetry = time.Second
	maxFenceRetry = time.Hour
	// maxShutdownGrace bounds node.shutdown-grace-period: a host's
	// shutdown waits that long at most for its pods, and the container
	// mode's unit (a static TimeoutStopSec=, 630 s) covers it.
	maxShutdownGrace = 10 * time.Minute
)

func k(parts ...string) toml.Key { return toml.Key(parts) }

// validate checks the values of the merged config. Keys whose value had the
// wrong type were reported already and are skipped here.
func (l *loader) validate(c *Config) {
	// An image's config may leave the machine to each host (LoadImage).
	if !(l.image && c.Machine == "") && l.required(k("machine"), c.Machine) {
		l.check(k("machine"), func() {
			// A DNS label, not a subdomain: the name becomes part of the
			// bootstrap token's group (system:bootstrappers:unbounded:<name>),
			// which may not contain a dot, and the Machine CRD enforces the
			// same (lib/api/identity.ValidateMachineName).
			if errs := validation.IsDNS1123Label(c.Machine); len(errs) > 0 {
				l.at(k("machine"), "%q is not a valid Machine/Node name: %s", c.Machine, strings.Join(errs, "; "))
			}
		})
	}
	l.check(k("mode"), func() {
		if !facts.Valid(c.Mode) {
			l.at(k("mode"), "must be one of nspawn, container, none, got %q", c.Mode)
		}
	})

	l.validateCluster(c)
	l.validateNode(c)
	l.validateNspawnAndDevices(c)
	l.validateArtifactKeys(c)
	l.validateArtifacts(c)
	l.validateAllocationFenceDaemon(c)
}

// check runs f, the check of key, unless key's value had the wrong type
// (reported already).
func (l *loader) check(key toml.Key, f func()) {
	if !l.broken[key.String()] {
		f()
	}
}

// required reports key when v, its value, is empty, and says whether v
// is set.
func (l *loader) required(key toml.Key, v string) bool {
	if v == "" && !l.broken[key.String()] {
		l.at(key, "required key is not set (see `unbounded config check --reference`)")
		return false
	}
	return v != ""
}

// validateCluster checks [cluster].
func (l *loader) validateCluster(c *Config) {
	if l.required(k("cluster", "api-server"), c.Cluster.APIServer) {
		l.check(k("cluster", "api-server"), func() {
			if msg := checkURL(c.Cluster.APIServer, "https"); msg != "" {
				l.at(k("cluster", "api-server"), "must be an https:// URL, got %q%s", shownURL(c.Cluster.APIServer), msg)
			}
		})
	}
	l.check(k("cluster", "ca-file"), func() { l.checkCA(c, k("cluster", "ca-file"), c.Cluster.CAFile) })
	if !l.image { // the host's, at its first boot
		l.check(k("cluster", "bootstrap-token-file"), func() {
			l.checkToken(c, k("cluster", "bootstrap-token-file"), c.Cluster.BootstrapTokenFile)
		})
	}
	if l.required(k("cluster", "kubernetes-version"), c.Cluster.KubernetesVersion) {
		l.check(k("cluster", "kubernetes-version"), func() {
			if !versionRE.MatchString(c.Cluster.KubernetesVersion) {
				l.at(k("cluster", "kubernetes-version"), "must be a version MAJOR.MINOR.PATCH such as \"1.36.3\", got %q", c.Cluster.KubernetesVersion)
			}
		})
	}
	l.check(k("cluster", "cluster-dns"), func() {
		if _, err := netip.ParseAddr(c.Cluster.ClusterDNS); err != nil {
			l.at(k("cluster", "cluster-dns"), "must be an IP address, got %q", c.Cluster.ClusterDNS)
		}
	})
}

// validateNode checks [node].
func (l *loader) validateNode(c *Config) {
	l.check(k("node", "labels"), func() {
		for _, name := range sortedStrings(c.Node.Labels) {
			if msg := checkLabel(name, c.Node.Labels[name]); msg != "" {
				l.at(k("node", "labels", name), "%s", msg)
			}
		}
	})
	l.check(k("node", "taints"), func() {
		seen := map[string]int{}
		for i, t := range c.Node.Taints {
			key, effect, msg := checkTaint(t)
			if msg != "" {
				l.at(k("node", "taints"), "element %d: %s", i+1, msg)
				continue
			}
			if j, dup := seen[key+":"+effect]; dup {
				l.at(k("node", "taints"), "element %d: taint %s:%s repeats element %d", i+1, key, effect, j)
			}
			seen[key+":"+effect] = i + 1
		}
	})

	if l.required(k("node", "sandbox-image"), c.Node.SandboxImage) {
		l.check(k("node", "sandbox-image"), func() {
			if !imageRefRE.MatchString(c.Node.SandboxImage) {
				l.at(k("node", "sandbox-image"), "must be an image reference such as \"registry.k8s.io/pause:3.10\", got %q", c.Node.SandboxImage)
			}
		})
	}
	l.check(k("node", "pod-cidr"), func() {
		if c.Node.PodCIDR == "" {
			return
		}
		if p, err := netip.ParsePrefix(c.Node.PodCIDR); err != nil || p.Masked() != p {
			l.at(k("node", "pod-cidr"), "must be a network in CIDR notation such as \"10.244.1.0/24\", got %q", c.Node.PodCIDR)
		}
	})
	l.check(k("node", "ip"), func() {
		if _, err := ParseNodeIPs(c.Node.IP); err != nil {
			l.at(k("node", "ip"), "%v", err)
		}
	})
	l.check(k("node", "serving-cert"), func() {
		switch c.Node.ServingCert {
		case ServingCertCluster, ServingCertSelfSigned:
		default:
			l.at(k("node", "serving-cert"), "must be one of %s, %s, got %q", ServingCertCluster, ServingCertSelfSigned, c.Node.ServingCert)
		}
	})
	l.check(k("node", "shutdown-grace-period"), func() {
		if d := c.Node.ShutdownGracePeriod.D(); d < 0 || d > maxShutdownGrace || d%time.Second != 0 {
			l.at(k("node", "shutdown-grace-period"), "must be whole seconds between 0s and %s, got %s", maxShutdownGrace, d)
		}
	})
	l.check(k("node", "shutdown-grace-period-critical-pods"), func() {
		d, all := c.Node.ShutdownGracePeriodCriticalPods.D(), c.Node.ShutdownGracePeriod.D()
		switch {
		case d < 0 || d%time.Second != 0:
			l.at(k("node", "shutdown-grace-period-critical-pods"), "must be whole seconds, at least 0s, got %s", d)
		case d > all && !l.broken["node.shutdown-grace-period"]:
			l.at(k("node", "shutdown-grace-period-critical-pods"), "must be at most node.shutdown-grace-period (%s), got %s: it is the last part of that period", all, d)
		}
	})
}

// validateNspawnAndDevices checks [nspawn] and [devices].
func (l *loader) validateNspawnAndDevices(c *Config) {
	l.check(k("nspawn", "image"), func() {
		img := c.Nspawn.Image
		switch {
		case img == "":
		case strings.HasPrefix(img, "oci-layout:"), strings.HasPrefix(img, "docker-archive:"):
			_, rest, _ := strings.Cut(img, ":")
			if !strings.HasPrefix(rest, "/") {
				l.at(k("nspawn", "image"), "the path after %q must be absolute, got %q", img[:len(img)-len(rest)], rest)
			}
		case !imageRefRE.MatchString(img):
			l.at(k("nspawn", "image"), "must be an image reference (\"registry.example/node:1.36.3\"), \"oci-layout:DIR[:TAG]\" or \"docker-archive:FILE[:TAG]\", got %q", img)
		}
	})

	for _, key := range []string{"allow", "deny"} {
		l.check(k("devices", key), func() {
			list := c.Devices.Allow
			if key == "deny" {
				list = c.Devices.Deny
			}
			for _, p := range list {
				if !strings.HasPrefix(p, "/dev/") || path.Clean(p) != p {
					l.at(k("devices", key), "must be device paths under /dev such as \"/dev/kvm\", got %q", p)
				}
			}
		})
	}
	l.check(k("devices", "allow"), func() {
		for _, p := range c.Devices.Allow {
			if slices.Contains(c.Devices.Deny, p) {
				l.at(k("devices", "allow"), "%s is in devices.deny too: give it or deny it", p)
			}
		}
	})
}

// validateArtifactKeys checks [artifacts]' keys (validateArtifacts their
// combination).
func (l *loader) validateArtifactKeys(c *Config) {
	l.check(k("artifacts", "base-url"), func() {
		if c.Artifacts.BaseURL == "" {
			return
		}
		if msg := checkURL(c.Artifacts.BaseURL, "https", "http"); msg != "" {
			l.at(k("artifacts", "base-url"), "must be an http:// or https:// URL, got %q%s", shownURL(c.Artifacts.BaseURL), msg)
		}
	})
	if l.required(k("artifacts", "offline-dir"), c.Artifacts.OfflineDir) {
		l.check(k("artifacts", "offline-dir"), func() { l.checkAbs(k("artifacts", "offline-dir"), c.Artifacts.OfflineDir) })
	}
	l.check(k("artifacts", "overrides"), func() {
		for _, name := range sortedStrings(c.Artifacts.Overrides) {
			o := c.Artifacts.Overrides[name]
			key := k("artifacts", "overrides", name)
			if !artifactRE.MatchString(name) {
				l.at(key, "artifact name %q must be lowercase letters, digits and '-'", name)
			} else if !contains(ArtifactNames, name) {
				l.at(key, "unknown artifact %q; the artifacts are %s", name, strings.Join(ArtifactNames, ", "))
			}
			if o.URL == "" {
				l.at(addKey(key, "url"), "required key is not set: an override names its URL")
			} else if msg := checkURL(o.URL, "https", "http"); msg != "" {
				l.at(addKey(key, "url"), "must be an http:// or https:// URL, got %q%s", shownURL(o.URL), msg)
			}
			if !sha256RE.MatchString(o.SHA256) {
				l.at(addKey(key, "sha256"), "must be the artifact's SHA-256, 64 hex digits, got %q", o.SHA256)
			}
		}
	})
}

// validateAllocationFenceDaemon checks [allocation], [fence] and [daemon].
func (l *loader) validateAllocationFenceDaemon(c *Config) {
	l.check(k("allocation", "uid"), func() {
		if c.Allocation.UID != "" && !uuidRE.MatchString(c.Allocation.UID) {
			l.at(k("allocation", "uid"), "must be the MachineAllocation's UID (a UUID), got %q", c.Allocation.UID)
		}
	})
	l.check(k("allocation", "name"), func() {
		if c.Allocation.Name == "" {
			return
		}
		if errs := validation.IsDNS1123Subdomain(c.Allocation.Name); len(errs) > 0 {
			l.at(k("allocation", "name"), "%q is not a valid object name: %s", c.Allocation.Name, strings.Join(errs, "; "))
		} else if c.Allocation.UID == "" && !l.broken["allocation.uid"] {
			l.at(k("allocation", "name"), "is set but allocation.uid is not: the fence checks the UID, a name alone would not be fenced")
		}
	})

	l.check(k("fence", "retry-budget"), func() {
		if d := c.Fence.RetryBudget.D(); d < minFenceRetry || d > maxFenceRetry {
			l.at(k("fence", "retry-budget"), "must be between %s and %s, got %s", minFenceRetry, maxFenceRetry, d)
		}
	})
	l.check(k("daemon", "log-level"), func() {
		if !contains(logLevels, c.Daemon.LogLevel) {
			l.at(k("daemon", "log-level"), "must be one of %s, got %q", strings.Join(logLevels, ", "), c.Daemon.LogLevel)
		}
	})
	l.check(k("daemon", "metrics-address"), func() {
		if a := c.Daemon.MetricsAddress; a != "" && !validListenAddress(a) {
			l.at(k("daemon", "metrics-address"), "must be IP:PORT (127.0.0.1:9464, [::1]:9464) or :PORT for every address, a port from 1 to 65535, got %q", a)
		}
	})
}

func contains(list []string, s string) bool { return slices.Contains(list, s) }

// validListenAddress: IP:PORT or :PORT, an IP literal (the daemon looks no
// name up) and a port from 1 to 65535.
func validListenAddress(a string) bool {
	if port, ok := strings.CutPrefix(a, ":"); ok {
		a = "0.0.0.0:" + port
	}
	ap, err := netip.ParseAddrPort(a)
	return err == nil && ap.Port() != 0 && !ap.Addr().Is4In6() && ap.Addr().Zone() == ""
}

func sortedStrings[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// shownURL is s as an error message may quote it: the userinfo before an
// '@' in the authority (a password, or a token used as the user name) is
// replaced. checkURL refuses such URLs, and the refusal goes to the journal
// and to `config check`'s output, so it must not repeat the secret. It
// works on the text, not on url.Parse, because a URL that does not parse
// can hold credentials too.
func shownURL(s string) string {
	_, rest, ok := strings.Cut(s, "://")
	if !ok {
		rest = s
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		return s
	}
	start := len(s) - len(rest)
	return s[:start] + "[credentials not shown]" + s[start+at:]
}

// checkURL returns "" when s is an absolute URL with one of schemes and a
// host, else the reason. The reason is quoted after the offending value, so
// it starts with ": " or is just "bad" (the caller's message says it all).
func checkURL(s string, schemes ...string) string {
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			return ": " + ue.Err.Error()
		}
		return ": " + err.Error()
	}
	switch {
	case !contains(schemes, u.Scheme):
		if u.Scheme == "" {
			return ": no scheme"
		}
		return ": scheme " + u.Scheme
	case u.Hostname() == "":
		return ": no host"
	case u.User != nil:
		return ": credentials do not belong in the URL"
	case u.RawQuery != "" || u.Fragment != "":
		return ": no query or fragment allowed"
	}
	return ""
}

// checkAbs reports a path that is not absolute: config paths are host
// paths, resolved under the root, and a relative one would depend on the
// working directory of whichever unit reads it.
func (l *loader) checkAbs(key toml.Key, p string) bool {
	if !path.IsAbs(p) {
		l.at(key, "must be an absolute path, got %q", p)
		return false
	}
	return true
}

func (l *loader) where(p string) string {
	if l.paths.Root == "" || l.paths.Root == "/" {
		return p
	}
	return fmt.Sprintf("%s (under root %s)", p, l.paths.Root)
}

func (l *loader) checkCA(c *Config, key toml.Key, p string) {
	if p == "" {
		l.at(key, "required key is empty")
		return
	}
	if !l.checkAbs(key, p) {
		return
	}
	data, err := readLimited(l.paths.Join(p))
	if err != nil && l.needsRoot(l.where(p), err) {
		return
	}
	if err != nil {
		l.at(key, "cannot read CA file %s: %s", l.where(p), describe(err))
		return
	}
	certs := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			if strings.TrimSpace(string(rest)) != "" && certs > 0 {
				l.at(key, "CA file %s has trailing data after its certificates", l.where(p))
				return
			}
			break
		}
		if b.Type != "CERTIFICATE" {
			l.at(key, "CA file %s holds a %q PEM block; only CERTIFICATE blocks belong in it", l.where(p), b.Type)
			return
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			l.at(key, "CA file %s: certificate %d does not parse: %v", l.where(p), certs+1, err)
			return
		}
		certs++
	}
	if certs == 0 {
		l.at(key, "CA file %s holds no PEM certificate", l.where(p))
	}
}

// checkToken checks the bootstrap token file: a regular file, 0600 or
// stricter, owned by the agent's user, holding one well-formed token. The token itself never enters a
// message.
func (l *loader) checkToken(c *Config, key toml.Key, p string) {
	if p == "" {
		l.at(key, "required key is empty")
		return
	}
	if !l.checkAbs(key, p) {
		return
	}
	file := l.paths.Join(p)
	fi, err := os.Stat(file)
	if err != nil {
		l.at(key, "bootstrap token file %s: %s", l.where(p), describe(err))
		return
	}
	if !fi.Mode().IsRegular() {
		l.at(key, "bootstrap token file %s is not a regular file (%s)", l.where(p), fi.Mode().Type())
		return
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		l.at(key, "bootstrap token file %s has mode %04o; it holds a secret and must be 0600 or stricter", l.where(p), perm)
		return
	}
	// Owned by the user the agent runs as (root on a host): a token file
	// another user owns can be replaced by that user, whatever its mode.
	// Checked without root, a token file root owns is what a host has:
	// the check then only lacks the right to read it (needsRoot below),
	// which is no problem of the file.
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != uint32(os.Geteuid()) && (st.Uid != 0 || privilege.IsRoot()) {
		l.at(key, "bootstrap token file %s is owned by uid %d; it holds a secret and must be owned by uid %d (the agent's user, root on a host)", l.where(p), st.Uid, os.Geteuid())
		return
	}
	if _, err := readToken(file); err != nil && !l.needsRoot(l.where(p), err) {
		l.at(key, "bootstrap token file %s: %v", l.where(p), err)
	}
}

// needsRoot records that what could not be read is root's alone and the
// process is not root (lib/privilege), and reports whether err was that.
// Such a file is not checked, and it is not reported as a problem of the
// configuration: running as root is what is missing.
func (l *loader) needsRoot(what string, err error) bool {
	e := privilege.FromErr(what, err)
	if e != nil {
		l.rootOnly = append(l.rootOnly, e)
	}
	return e != nil
}

func describe(err error) string {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "no such file"
	case errors.Is(err, os.ErrPermission):
		return "permission denied"
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// kubeletNamespaces are the label namespaces (and their subdomains) a
// kubelet may set on its own Node; wellKnownKubeletLabels are the single
// labels it may set in kubernetes.io. Any other kubernetes.io or k8s.io
// label makes the kubelet refuse to start (NodeRestriction), so it is an
// error here, before a node is built around it.
var (
	kubeletNamespaces      = []string{"kubelet.kubernetes.io", "node.kubernetes.io"}
	wellKnownKubeletLabels = []string{
		"kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch",
		"beta.kubernetes.io/os", "beta.kubernetes.io/arch", "beta.kubernetes.io/instance-type",
		"node.kubernetes.io/instance-type",
		"topology.kubernetes.io/zone", "topology.kubernetes.io/region",
		"failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
	}
)

func checkLabel(name, value string) string {
	if errs := validation.IsQualifiedName(name); len(errs) > 0 {
		return fmt.Sprintf("label key %q is invalid: %s", name, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
		return fmt.Sprintf("label value %q is invalid: %s", value, strings.Join(errs, "; "))
	}
	ns, _, found := strings.Cut(name, "/")
	if !found {
		return ""
	}
	reserved := ns == "kubernetes.io" || strings.HasSuffix(ns, ".kubernetes.io") || ns == "k8s.io" || strings.HasSuffix(ns, ".k8s.io")
	if !reserved || contains(wellKnownKubeletLabels, name) {
		return ""
	}
	for _, allowed := range kubeletNamespaces {
		if ns == allowed || strings.HasSuffix(ns, "."+allowed) {
			return ""
		}
	}
	return fmt.Sprintf("label %q is in the reserved namespace %s, which a kubelet may not set on its own Node (allowed: %s, and the namespaces %s)",
		name, ns, strings.Join(wellKnownKubeletLabels, ", "), strings.Join(kubeletNamespaces, ", "))
}

// checkTaint parses "key=value:Effect" or "key:Effect", the kubelet's
// --register-with-taints syntax.
func checkTaint(t string) (key, effect, msg string) {
	spec, effect, ok := strings.Cut(t, ":")
	if !ok || strings.Contains(effect, ":") {
		return "", "", fmt.Sprintf("taint %q must be key=value:Effect or key:Effect", t)
	}
	key, value, _ := strings.Cut(spec, "=")
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return "", "", fmt.Sprintf("taint %q: key is invalid: %s", t, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
		return "", "", fmt.Sprintf("taint %q: value is invalid: %s", t, strings.Join(errs, "; "))
	}
	if !contains(taintEffects, effect) {
		return "", "", fmt.Sprintf("taint %q: effect must be one of %s", t, strings.Join(taintEffects, ", "))
	}
	return key, effect, ""
}

// ParseNodeIPs reads node.ip: empty (nil: detect), one address, or an
// IPv4 and an IPv6 address separated by a comma. An address the kubelet
// could not be reached at as a Node (unspecified, loopback, multicast,
// link-local) is refused.
func ParseNodeIPs(s string) ([]netip.Addr, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return nil, fmt.Errorf("at most two addresses (an IPv4 and an IPv6 one, dual-stack), got %d in %q", len(parts), s)
	}
	var ips []netip.Addr
	for _, p := range parts {
		a, err := netip.ParseAddr(strings.TrimSpace(p))
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("must be an IP address such as \"192.0.2.10\" or \"2001:db8::10\" (or one of each, comma-separated), got %q", s)
		}
		a = a.Unmap()
		switch {
		case a.IsUnspecified(), a.IsLoopback(), a.IsMulticast(), a.IsLinkLocalUnicast():
			return nil, fmt.Errorf("%s is not an address other hosts reach a Node at (unspecified, loopback, multicast or link-local)", a)
		}
		if len(ips) == 1 && ips[0].Is4() == a.Is4() {
			return nil, fmt.Errorf("two addresses of one family (%s, %s): dual-stack is one IPv4 and one IPv6 address", ips[0], a)
		}
		ips = append(ips, a)
	}
	return ips, nil
}
