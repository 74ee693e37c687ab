package config

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/BurntSushi/toml"
)

// ArtifactNames are the node stack artifacts, in the order they are
// fetched. crictl is optional (fetched only when crictl-version is set),
// and so is coredns (only when node.local-dns is on).
var ArtifactNames = []string{"kubelet", "containerd", "runc", "cni-plugins", "crictl", "coredns"}

// placeholderRE finds the {placeholders} of a URL template.
var placeholderRE = regexp.MustCompile(`\{[^{}]*\}`)

// urlPlaceholders are the placeholders a template may use.
var urlPlaceholders = []string{"{name}", "{version}", "{arch}"}

// ArtifactVersion is the version of artifact name, without a leading "v"
// ("" for crictl when it is not fetched, or an unknown name). The kubelet's
// is the cluster's Kubernetes version.
func (c *Config) ArtifactVersion(name string) string {
	var v string
	switch name {
	case "kubelet":
		v = c.Cluster.KubernetesVersion
	case "containerd":
		v = c.Artifacts.ContainerdVersion
	case "runc":
		v = c.Artifacts.RuncVersion
	case "cni-plugins":
		v = c.Artifacts.CNIPluginsVersion
	case "crictl":
		v = c.Artifacts.CrictlVersion
	case "coredns":
		v = c.Artifacts.CoreDNSVersion
	}
	return strings.TrimPrefix(v, "v")
}

// ArtifactURLTemplate is the URL template of artifact name (its
// [artifacts] <name>-path key) ("" for an
// unknown name).
func (c *Config) ArtifactURLTemplate(name string) string {
	switch name {
	case "kubelet":
		return c.Artifacts.KubeletPath
	case "containerd":
		return c.Artifacts.ContainerdPath
	case "runc":
		return c.Artifacts.RuncPath
	case "cni-plugins":
		return c.Artifacts.CNIPluginsPath
	case "crictl":
		return c.Artifacts.CrictlPath
	case "coredns":
		return c.Artifacts.CoreDNSPath
	}
	return ""
}

// ArtifactsWanted are the artifacts this config fetches: every name of
// ArtifactNames but crictl and coredns, crictl when crictl-version is set
// and coredns when node.local-dns is on.
func (c *Config) ArtifactsWanted() []string {
	var names []string
	for _, n := range ArtifactNames {
		if n == "crictl" && c.Artifacts.CrictlVersion == "" || n == "coredns" && !c.Node.LocalDNS {
			continue
		}
		names = append(names, n)
	}
	return names
}

// ExpandArtifactURL fills the placeholders of a URL template.
func ExpandArtifactURL(template, name, version, arch string) string {
	return strings.NewReplacer("{name}", name, "{version}", strings.TrimPrefix(version, "v"), "{arch}", arch).Replace(template)
}

// checkRelPath returns "" when p is a clean relative slash path naming a
// file (what a template expands to, and checksums-file), else the reason.
// It is a path under base-url and under offline-dir both, so ".." (which
// would leave offline-dir), a leading "/", a scheme, a query and a
// backslash are refused.
func checkRelPath(p string) string {
	switch {
	case p == "":
		return "is empty"
	case strings.Contains(p, "://"):
		return "is a URL; it must be a path relative to base-url (a whole URL for one artifact goes in artifacts.overrides.<name>.url)"
	case strings.HasPrefix(p, "/"):
		return "must be relative to base-url and offline-dir, not start with /"
	case strings.ContainsAny(p, "?#\\"):
		return "must be a plain path: no ?, # or \\"
	case strings.HasSuffix(p, "/"):
		return "must name a file, not end with /"
	case path.Clean(p) != p:
		return fmt.Sprintf("must be a clean path (%q), without . or .. or //", path.Clean(p))
	case p == ".." || strings.HasPrefix(p, "../"):
		return "must stay under base-url and offline-dir (no ..)"
	}
	return ""
}

// validateArtifacts checks the [artifacts] keys that pick versions, URL
// templates and checksums (base-url, offline-dir and overrides are checked
// in validate).
func (l *loader) validateArtifacts(c *Config) {
	check := func(key toml.Key, f func()) {
		if !l.broken[key.String()] {
			f()
		}
	}
	for _, name := range ArtifactNames {
		if name == "kubelet" {
			continue // cluster.kubernetes-version, checked with the cluster
		}
		key := k("artifacts", name+"-version")
		check(key, func() {
			v := c.ArtifactVersion(name)
			if v == "" && (name == "crictl" || name == "coredns" && !c.Node.LocalDNS) {
				return
			}
			if !versionRE.MatchString(v) {
				l.at(key, "must be a version MAJOR.MINOR.PATCH such as \"1.6.20\", got %q", v)
			}
		})
	}
	for _, name := range ArtifactNames {
		key := k("artifacts", name+"-path")
		check(key, func() {
			t := c.ArtifactURLTemplate(name)
			for _, ph := range placeholderRE.FindAllString(t, -1) {
				if !contains(urlPlaceholders, ph) {
					l.at(key, "unknown placeholder %s in %q; the placeholders are %s", ph, t, strings.Join(urlPlaceholders, ", "))
					return
				}
			}
			expanded := ExpandArtifactURL(t, name, "1.2.3", "amd64")
			if strings.ContainsAny(expanded, "{}") {
				l.at(key, "unbalanced brace in %q", t)
				return
			}
			if msg := checkRelPath(expanded); msg != "" {
				l.at(key, "%s, got %q", msg, t)
			}
		})
	}
	check(k("artifacts", "checksums-file"), func() {
		if f := c.Artifacts.ChecksumsFile; f != "" {
			if msg := checkRelPath(f); msg != "" {
				l.at(k("artifacts", "checksums-file"), "%s, got %q", msg, f)
			}
		}
	})
	check(k("artifacts", "checksums"), func() {
		for _, name := range sortedStrings(c.Artifacts.Checksums) {
			key := k("artifacts", "checksums", name)
			if !contains(ArtifactNames, name) {
				l.at(key, "unknown artifact %q; the artifacts are %s", name, strings.Join(ArtifactNames, ", "))
				continue
			}
			if sum := c.Artifacts.Checksums[name]; !sha256RE.MatchString(sum) {
				l.at(key, "must be the artifact's SHA-256, 64 hex digits, got %q", sum)
			}
		}
		if c.Artifacts.ChecksumsFile != "" || l.broken["artifacts.checksums-file"] || l.broken["artifacts.overrides"] {
			return
		}
		// No sums file: a file without a pinned checksum could not be
		// verified, so say now which ones, not at the first download.
		for _, name := range c.ArtifactsWanted() {
			if c.Artifacts.Checksums[name] != "" || c.Artifacts.Overrides[name].SHA256 != "" {
				continue
			}
			l.at(k("artifacts", "checksums", name), "required key is not set: artifacts.checksums-file is empty, so every artifact needs a pinned SHA-256 (here, or in artifacts.overrides.%s.sha256)", name)
		}
	})
}
