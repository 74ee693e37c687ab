// Package config loads and validates the operator configuration,
// /etc/unbounded/agent.toml and its drop-ins (ARCHITECTURE section 8).
//
// The defaults, every key and the drop-in merge rule are documented in one
// place, reference.toml, which is embedded and loaded as the first layer:
// a default that is not in that file does not exist. Loading is strict
// (unknown keys, wrong types, missing required keys and invalid values are
// all errors that name file, line and key, see Error) and read-only: it
// never creates, changes or removes anything on the host, so
// `unbounded config check` is safe on a live node.
//
// Secrets are never part of the TOML: the bootstrap token lives in its own
// file, which Load checks (mode, format) without keeping the value; code
// that needs it calls ReadBootstrapToken and gets a Secret that does not
// print.
package config

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/privilege"
	"unbounded-cloud.io/agent/lib/regfile"
)

// Reference is the commented reference configuration: every key, its
// default, and the merge rule. It is the first layer of every load.
//
//go:embed reference.toml
var Reference string

// Config is the effective configuration. Paths in it are host paths (as
// the host sees them); resolve them with Resolve.
type Config struct {
	Machine    string     `toml:"machine"`
	Mode       string     `toml:"mode"`
	Cluster    Cluster    `toml:"cluster"`
	Node       Node       `toml:"node"`
	Artifacts  Artifacts  `toml:"artifacts"`
	Allocation Allocation `toml:"allocation"`
	Fence      Fence      `toml:"fence"`
	Daemon     Daemon     `toml:"daemon"`
	Nspawn     Nspawn     `toml:"nspawn"`
	Devices    Devices    `toml:"devices"`

	// Files are the files the configuration was merged from, in order
	// (the embedded reference not included).
	Files []string `toml:"-"`
	paths hostpaths.Paths
	// locate finds the file and line that set a key (KeyError).
	locate func(key toml.Key) (file string, line int)
}

// KeyError is a problem with the effective value of key (dotted, such as
// "node.ip") found after loading, when the host is looked at: located
// like a load's own errors, in the file and at the line that set it, and
// an exit 78 like them.
func (c *Config) KeyError(key, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	tk := toml.Key(strings.Split(key, "."))
	if c.locate != nil {
		if file, line := c.locate(tk); file != "" {
			return &Error{File: file, Line: line, Key: key, Msg: msg}
		}
	}
	file := ""
	if len(c.Files) > 0 {
		file = c.Files[0]
	}
	return &Error{File: file, Key: key, Msg: msg + " (the default value; set " + key + " to change it)"}
}

// Cluster is how the host reaches the cluster.
type Cluster struct {
	APIServer          string `toml:"api-server"`
	CAFile             string `toml:"ca-file"`
	BootstrapTokenFile string `toml:"bootstrap-token-file"`
	KubernetesVersion  string `toml:"kubernetes-version"`
	ClusterDNS         string `toml:"cluster-dns"`
}

// Node is what the Node object gets.
type Node struct {
	Labels map[string]string `toml:"labels"`
	Taints []string          `toml:"taints"`
	// SandboxImage is containerd's pause image (sandbox_image).
	SandboxImage string `toml:"sandbox-image"`
	// PodCIDR, when set, makes the node stack get a bridge CNI config
	// with host-local addresses from this range; empty leaves CNI to the
	// cluster.
	PodCIDR string `toml:"pod-cidr"`
	// ServingCert is where the kubelet's serving certificate comes from:
	// "cluster" (a kubernetes.io/kubelet-serving CSR the cluster's
	// approver approves: serverTLSBootstrap) or "self-signed" (the
	// kubelet makes its own, which the API server cannot verify).
	ServingCert string `toml:"serving-cert"`
	// IP is the Node's address, or an IPv4 and an IPv6 address separated
	// by a comma (dual-stack); empty: the default route's (NodeIPs).
	IP string `toml:"ip"`
	// LocalDNS runs a DNS cache in the node stack (CoreDNS, the coredns
	// artifact) on link-local addresses, and points the kubelet's
	// clusterDNS at it (lib/modes/nodestack's LocalDNS).
	LocalDNS bool `toml:"local-dns"`
	// ShutdownGracePeriod is the kubelet's graceful node shutdown
	// (shutdownGracePeriod): how long a shutdown of the node (the host's
	// poweroff or reboot, a restart of the node stack) waits, behind a
	// logind delay inhibitor, while the kubelet ends its pods within their
	// grace periods. 0 turns it off: pods are killed at the end.
	ShutdownGracePeriod Duration `toml:"shutdown-grace-period"`
	// ShutdownGracePeriodCriticalPods is the part of ShutdownGracePeriod
	// kept for critical pods, ended after the others
	// (shutdownGracePeriodCriticalPods).
	ShutdownGracePeriodCriticalPods Duration `toml:"shutdown-grace-period-critical-pods"`
}

// The values of node.serving-cert.
const (
	ServingCertCluster    = "cluster"
	ServingCertSelfSigned = "self-signed"
)

// Nspawn configures the nspawn isolation mode.
type Nspawn struct {
	// Image is the OCI image of the node's rootfs (lib/modes.Image.Ref).
	Image string `toml:"image"`
}

// Devices says which host devices the node is given (lib/devices). Mode
// none runs on the host and sees them all anyway.
type Devices struct {
	// Auto gives the devices discovery finds (lib/devices.Discover).
	Auto bool `toml:"auto"`
	// Allow and Deny are device paths given, or never given, whatever
	// discovery says.
	Allow []string `toml:"allow"`
	Deny  []string `toml:"deny"`
	// RDMAModules loads rdma_ucm and ib_umad at prepare, so that
	// /dev/infiniband has the RDMA CM and MAD devices to give.
	RDMAModules bool `toml:"rdma-modules"`
}

// Artifacts says where the node stack comes from: which versions, at
// which URLs, checked against which SHA-256 (lib/artifacts fetches them;
// artifacts.go here validates these keys). The per-artifact keys are flat
// (<name>-version, <name>-path), not sub-tables, so that a drop-in that
// sets one keeps the others ([artifacts] merges key by key).
type Artifacts struct {
	BaseURL           string              `toml:"base-url"`
	OfflineDir        string              `toml:"offline-dir"`
	ContainerdVersion string              `toml:"containerd-version"`
	RuncVersion       string              `toml:"runc-version"`
	CNIPluginsVersion string              `toml:"cni-plugins-version"`
	CrictlVersion     string              `toml:"crictl-version"`
	CoreDNSVersion    string              `toml:"coredns-version"`
	KubeletPath       string              `toml:"kubelet-path"`
	ContainerdPath    string              `toml:"containerd-path"`
	RuncPath          string              `toml:"runc-path"`
	CNIPluginsPath    string              `toml:"cni-plugins-path"`
	CrictlPath        string              `toml:"crictl-path"`
	CoreDNSPath       string              `toml:"coredns-path"`
	ChecksumsFile     string              `toml:"checksums-file"`
	Checksums         map[string]string   `toml:"checksums"`
	Overrides         map[string]Override `toml:"overrides"`
}

// Override is the source of one artifact, replacing base-url for it.
type Override struct {
	URL    string `toml:"url"`
	SHA256 string `toml:"sha256"`
}

// Allocation names the MachineAllocation the host was launched for.
type Allocation struct {
	UID  string `toml:"uid"`
	Name string `toml:"name"`
}

// Fence configures the allocation fence.
type Fence struct {
	RetryBudget Duration `toml:"retry-budget"`
}

// Daemon configures the daemon and the one-shots' logging.
type Daemon struct {
	LogLevel string `toml:"log-level"`
	// MetricsAddress is where the daemon serves the host's metrics
	// (IP:PORT or :PORT); "" serves none.
	MetricsAddress string `toml:"metrics-address"`
}

// Duration is a time.Duration written in TOML as a Go duration string
// ("2m"), because TOML has no duration type and a bare integer would leave
// the unit to guesswork.
type Duration time.Duration

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("invalid duration %q: use Go's syntax, such as \"90s\" or \"2m\"", b)
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration back in Go's syntax.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Resolve gives the path on disk of a host path named in the config (under
// the root the config was loaded with).
func (c *Config) Resolve(hostPath string) string { return c.paths.Join(hostPath) }

// maxFileSize bounds what Load reads: a config file is a few hundred bytes,
// and a multi-megabyte one is a mistake (a wrong --file), not a config.
const maxFileSize = 1 << 20

// Load reads the host's configuration, /etc/unbounded/agent.toml and
// /etc/unbounded/agent.toml.d/*.toml, under p's root. See LoadFile.
func Load(p hostpaths.Paths) (*Config, error) {
	return LoadFile(p, p.ConfigFile())
}

// ErrRecorded: a config recorded as JSON does not decode.
var ErrRecorded = errors.New("the recorded config does not decode")

// LoadEffective is a config recorded as JSON (an applied record's, a
// repave's or a reprovision's journal: the effective config, Files left
// out) bound to the host under p: the config on disk is loaded for the
// root its paths resolve under and the files it came from, then the
// recorded config laid over it, whatever the files say by now.
func LoadEffective(p hostpaths.Paths, raw []byte) (*Config, error) {
	cfg, err := Load(p)
	if err != nil {
		return nil, err
	}
	files := cfg.Files
	if err := json.Unmarshal(raw, cfg); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRecorded, err)
	}
	cfg.Files = files
	return cfg, nil
}

// LoadFile reads the configuration file at file (a path on disk, used as
// given) and its drop-ins in file+".d/*.toml" in lexical order, over the
// embedded reference. Paths named inside resolve under p's root. The error,
// if any, is a config.Errors holding every problem found; it matches
// exitcode.ErrConfigInvalid. A missing file is fine when drop-ins exist
// (the required keys still have to be set somewhere); with neither, the
// error wraps os.ErrNotExist.
func LoadFile(p hostpaths.Paths, file string) (*Config, error) {
	l := &loader{paths: p, main: file, origin: map[string]int{}, broken: map[string]bool{}}
	return l.load()
}

// LoadImage reads the configuration baked into an image's root p (an
// image builder's `unbounded prepare --root DIR`) as Load does, except
// for what each host booted from the image gets at its first boot and the
// image must not carry: the machine's name and the bootstrap token (its
// file may be absent). Every other key is checked as on a host.
func LoadImage(p hostpaths.Paths) (*Config, error) {
	l := &loader{image: true, paths: p, main: p.ConfigFile(), origin: map[string]int{}, broken: map[string]bool{}}
	return l.load()
}

type source struct {
	file  string
	lines lineIndex
}

type loader struct {
	// image: the config of an image being built, not of a host
	// (LoadImage): the host's own keys are not required.
	image   bool
	paths   hostpaths.Paths
	main    string
	sources []source
	// origin maps a key (toml.Key.String()) to the index in sources of
	// the file whose value won.
	origin map[string]int
	// broken holds keys whose value had the wrong type; semantic checks
	// skip them so a problem is reported once.
	broken map[string]bool
	errs   Errors
	// rootOnly are the files that could not be read because only root
	// may read them and the process is not root (see needsRoot).
	rootOnly []*privilege.Error
}

func (l *loader) add(file string, line int, key toml.Key, msg string, err error) {
	l.errs = append(l.errs, &Error{File: file, Line: line, Key: key.String(), Msg: msg, Err: err})
}

// at reports a problem with the effective value of key, located in the
// file that set it (or, for a default, in the main file without a line).
func (l *loader) at(key toml.Key, format string, args ...any) {
	for n := len(key); n > 0; n-- {
		if i, ok := l.origin[key[:n].String()]; ok {
			s := l.sources[i]
			l.add(s.file, s.lines.lookup(key), key, fmt.Sprintf(format, args...), nil)
			return
		}
	}
	msg := fmt.Sprintf(format, args...)
	if !strings.HasPrefix(msg, "required key") {
		// The value is the reference default: say so, or the operator
		// looks for a line that does not exist.
		msg += " (the default value; set " + key.String() + " to change it)"
	}
	l.add(l.main, 0, key, msg, nil)
}

func (l *loader) files() []string {
	var files []string
	if fi, err := os.Stat(l.main); err == nil || !errors.Is(err, fs.ErrNotExist) {
		if err == nil && fi.IsDir() {
			l.add(l.main, 0, nil, "is a directory, not a config file", nil)
		} else {
			files = append(files, l.main)
		}
	}
	dir := l.main + ".d"
	// regfile.ReadDir: a FIFO named agent.toml.d must not block the
	// loader (and with it the fence and the daemon).
	entries, err := regfile.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !l.needsRoot(dir, err) {
		l.add(dir, 0, nil, fmt.Sprintf("cannot read drop-in directory: %v", err), err)
	}
	var dropins []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".toml") {
			dropins = append(dropins, e.Name())
		}
	}
	sort.Strings(dropins) // lexical, as systemd orders its drop-ins
	for _, name := range dropins {
		files = append(files, filepath.Join(dir, name))
	}
	if len(files) == 0 && len(l.errs) == 0 {
		l.add(l.main, 0, nil, "no such file, and no drop-ins in "+dir+"; "+noConfigHint, fs.ErrNotExist)
	}
	return files
}

// readLimited reads a file named by the configuration (a config file, a
// drop-in, the token file, the CA file) through lib/regfile: a regular
// file (symlinks followed), opened without blocking, at most maxFileSize
// bytes. A FIFO among the drop-ins would otherwise hang `unbounded config
// check`, the fence and the daemon; a symlink to /dev/zero would never
// end. Anything else is a config error naming the file.
func readLimited(file string) ([]byte, error) {
	return regfile.Read(file, maxFileSize)
}

// parse decodes one file into a generic tree, reporting a syntax error at
// the decoder's position.
func parse(file string, data []byte) (map[string]any, bool, []*Error) {
	tree := map[string]any{}
	if _, err := toml.Decode(string(data), &tree); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, false, []*Error{{File: file, Line: pe.Position.Line, Key: pe.LastKey, Msg: "invalid TOML: " + pe.Message}}
		}
		return nil, false, []*Error{{File: file, Msg: "invalid TOML: " + strings.TrimPrefix(err.Error(), "toml: ")}}
	}
	return tree, true, nil
}

var configType = reflect.TypeFor[Config]()

func (l *loader) load() (*Config, error) {
	merged, ok, errs := parse("reference.toml", []byte(Reference))
	if !ok { // a broken reference is a build defect, caught by its test
		return nil, Errors(errs)
	}
	files := l.files()
	// incomplete: a file is missing, unreadable or not TOML.
	incomplete := len(files) == 0 || len(l.errs) > 0
	for _, file := range files {
		data, err := readLimited(file)
		if err != nil && l.needsRoot(file, err) {
			incomplete = true
			continue
		}
		if err != nil {
			msg := err.Error()
			var pe *fs.PathError
			if errors.As(err, &pe) {
				msg = pe.Err.Error() // the file is named already
			}
			l.add(file, 0, nil, "cannot read: "+msg, err)
			incomplete = true
			continue
		}
		tree, ok, errs := parse(file, data)
		if !ok {
			l.errs = append(l.errs, errs...)
			incomplete = true
			continue
		}
		src := source{file: file, lines: indexLines(string(data))}
		l.sources = append(l.sources, src)
		bad := map[string]bool{}
		checkTree(tree, configType, nil, func(k toml.Key, msg string) {
			l.add(file, src.lines.lookup(k), k, msg, nil)
			bad[k.String()] = true
		})
		dropBad(tree, nil, bad)
		idx := len(l.sources) - 1
		mergeTree(merged, tree, configType, nil, func(k toml.Key) {
			l.origin[k.String()] = idx
			delete(l.broken, k.String())
		})
		for k := range bad {
			l.broken[k] = true
		}
	}
	cfg, err := decodeTree(merged)
	if err != nil {
		// Cannot happen for a tree that passed checkTree; say so plainly
		// rather than hide it.
		l.add(l.main, 0, nil, "internal error decoding the merged configuration: "+err.Error(), err)
		return nil, l.errs
	}
	cfg.paths = l.paths
	for _, s := range l.sources {
		cfg.Files = append(cfg.Files, s.file)
	}
	cfg.locate = func(key toml.Key) (string, int) {
		for n := len(key); n > 0; n-- {
			if i, ok := l.origin[key[:n].String()]; ok {
				return l.sources[i].file, l.sources[i].lines.lookup(key)
			}
		}
		return "", 0
	}
	// Without all of its files the merged config is not the operator's:
	// checking its values would only add noise ("machine: required key is
	// not set" when the file that sets it has a syntax error).
	if !incomplete {
		l.validate(cfg)
	}
	return l.result(cfg)
}

// result is the outcome of a load. What could not be read for want of
// root decides it only when nothing else is wrong: then the error is the
// *privilege.Error (exit 4, "run it as root"); next to real problems it is
// listed as unchecked, and the configuration is invalid (78) whoever runs
// the check.
func (l *loader) result(cfg *Config) (*Config, error) {
	if len(l.errs) == 0 && len(l.rootOnly) > 0 {
		return nil, l.rootOnly[0]
	}
	for _, e := range l.rootOnly {
		l.add(e.Path, 0, nil, "not checked: only root may read it (run the check as root)", nil)
	}
	if len(l.errs) > 0 {
		return nil, l.errs
	}
	return cfg, nil
}

// dropBad removes the values checkTree rejected, so that the merge keeps
// the earlier (valid) value and decoding the merged tree cannot fail.
func dropBad(tree map[string]any, key toml.Key, bad map[string]bool) {
	for k, v := range tree {
		sub := addKey(key, k)
		if bad[sub.String()] {
			delete(tree, k)
			continue
		}
		if m, ok := v.(map[string]any); ok {
			dropBad(m, sub, bad)
		}
	}
}

// decodeTree turns the merged generic tree into a Config by a round trip
// through the TOML encoder: the tree has passed the schema check, and this
// keeps one decoder (BurntSushi's) for every value.
func decodeTree(tree map[string]any) (*Config, error) {
	var b strings.Builder
	if err := toml.NewEncoder(&b).Encode(tree); err != nil {
		return nil, err
	}
	var cfg Config
	md, err := toml.Decode(b.String(), &cfg)
	if err != nil {
		return nil, err
	}
	if un := md.Undecoded(); len(un) > 0 {
		return nil, fmt.Errorf("keys left undecoded: %v", un)
	}
	return &cfg, nil
}
