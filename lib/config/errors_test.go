package config

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/tests/tiers"
)

// want describes one expected error: the host path of the file it names,
// the line (0: none), the dotted key and a part of the message.
type want struct {
	file string
	line int
	key  string
	msg  string
}

const (
	mainFile  = "/etc/unbounded/agent.toml"
	dropinDir = "/etc/unbounded/agent.toml.d"
)

func TestLoadReportsEachErrorClassWithFileLineAndKey(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(h *host)
		want  want
	}{
		{"syntax error at the decoder's line", func(h *host) {
			h.edit(mainFile, `mode = "nspawn"`, `mode = "nspawn`)
		}, want{mainFile, 2, "mode", "invalid TOML: strings cannot contain newlines"}},
		{"duplicate key is a syntax error", func(h *host) {
			h.edit(mainFile, `cluster-dns = "10.96.0.10"`, "cluster-dns = \"10.96.0.10\"\ncluster-dns = \"10.96.0.11\"")
		}, want{mainFile, 10, "cluster.cluster-dns", "has already been defined"}},
		{"unknown top-level key", func(h *host) {
			h.edit(mainFile, "mode = \"nspawn\"\n", "mode = \"nspawn\"\ncolour = 1\n")
		}, want{mainFile, 3, "colour", "unknown key"}},
		{"unknown key in a section", func(h *host) {
			h.edit(mainFile, "[cluster]\n", "[cluster]\napi-servr = \"https://x\"\n")
		}, want{mainFile, 5, "cluster.api-servr", "unknown key"}},
		{"unknown section", func(h *host) {
			h.edit(mainFile, "[allocation]", "[fencing]\nretry = \"1m\"\n[allocation]")
		}, want{mainFile, 18, "fencing", "unknown key"}},
		{"unknown key as a dotted key", func(h *host) {
			h.edit(mainFile, "mode = \"nspawn\"\n", "mode = \"nspawn\"\nnode.colour = \"red\"\n")
		}, want{mainFile, 3, "node.colour", "unknown key"}},
		{"string given as integer", func(h *host) {
			h.edit(mainFile, `cluster-dns = "10.96.0.10"`, `cluster-dns = 10`)
		}, want{mainFile, 9, "cluster.cluster-dns", "must be a string, got an integer"}},
		{"table given as string", func(h *host) {
			h.edit(mainFile, `labels = { "topology.kubernetes.io/zone" = "edge-1" }`, `labels = "zone=edge-1"`)
		}, want{mainFile, 12, "node.labels", "must be a table of strings, got a string"}},
		{"section given as value", func(h *host) {
			h.edit(mainFile, "mode = \"nspawn\"\n", "mode = \"nspawn\"\nfence = 3\n")
		}, want{mainFile, 3, "fence", "must be a table, got an integer"}},
		{"array element of the wrong type", func(h *host) {
			h.edit(mainFile, `taints = ["dedicated=gpu:NoSchedule"]`, `taints = ["a:NoSchedule", 7]`)
		}, want{mainFile, 13, "node.taints", "element 2: must be a string, got an integer"}},
		{"label value of the wrong type", func(h *host) {
			h.edit(mainFile, `"topology.kubernetes.io/zone" = "edge-1"`, `"topology.kubernetes.io/zone" = true`)
		}, want{mainFile, 12, `node.labels."topology.kubernetes.io/zone"`, "must be a string, got a boolean"}},
		{"duration not parseable", func(h *host) {
			h.edit(mainFile, "[allocation]", "[fence]\nretry-budget = \"2 minutes\"\n[allocation]")
		}, want{mainFile, 19, "fence.retry-budget", `invalid duration "2 minutes"`}},
		{"duration given as integer", func(h *host) {
			h.edit(mainFile, "[allocation]", "[fence]\nretry-budget = 120\n[allocation]")
		}, want{mainFile, 19, "fence.retry-budget", "must be a duration string"}},
		{"duration out of range", func(h *host) {
			h.edit(mainFile, "[allocation]", "[fence]\nretry-budget = \"0s\"\n[allocation]")
		}, want{mainFile, 19, "fence.retry-budget", "must be between 1s and 1h0m0s"}},
		{"shutdown grace not in whole seconds", func(h *host) {
			h.edit(mainFile, `taints = ["dedicated=gpu:NoSchedule"]`, "taints = [\"dedicated=gpu:NoSchedule\"]\nshutdown-grace-period = \"1500ms\"")
		}, want{mainFile, 14, "node.shutdown-grace-period", "must be whole seconds between 0s and 10m0s, got 1.5s"}},
		{"shutdown grace too long", func(h *host) {
			h.edit(mainFile, `taints = ["dedicated=gpu:NoSchedule"]`, "taints = [\"dedicated=gpu:NoSchedule\"]\nshutdown-grace-period = \"2h\"")
		}, want{mainFile, 14, "node.shutdown-grace-period", "must be whole seconds between 0s and 10m0s, got 2h0m0s"}},
		{"critical pods' shutdown grace longer than the whole", func(h *host) {
			h.edit(mainFile, `taints = ["dedicated=gpu:NoSchedule"]`, "taints = [\"dedicated=gpu:NoSchedule\"]\nshutdown-grace-period = \"5s\"\nshutdown-grace-period-critical-pods = \"10s\"")
		}, want{mainFile, 15, "node.shutdown-grace-period-critical-pods", "must be at most node.shutdown-grace-period (5s), got 10s"}},
		{"required machine missing", func(h *host) {
			h.edit(mainFile, "machine = \"site-w1\"\n", "")
		}, want{mainFile, 0, "machine", "required key is not set"}},
		{"required api-server missing", func(h *host) {
			h.edit(mainFile, "api-server = \"https://127.0.0.1:1\"\n", "")
		}, want{mainFile, 0, "cluster.api-server", "required key is not set"}},
		{"required kubernetes-version empty", func(h *host) {
			h.edit(mainFile, `kubernetes-version = "1.36.3"`, `kubernetes-version = ""`)
		}, want{mainFile, 8, "cluster.kubernetes-version", "required key is not set"}},
		{"machine not a DNS name", func(h *host) {
			h.edit(mainFile, `machine = "site-w1"`, `machine = "Site W1"`)
		}, want{mainFile, 1, "machine", `"Site W1" is not a valid Machine/Node name`}},
		// A label, not a subdomain: the name is part of the bootstrap
		// token's group, which may not hold a dot (and the CRD agrees).
		{"machine with a dot", func(h *host) {
			h.edit(mainFile, `machine = "site-w1"`, `machine = "site.w1"`)
		}, want{mainFile, 1, "machine", `"site.w1" is not a valid Machine/Node name`}},
		{"mode not an isolation mode", func(h *host) {
			h.edit(mainFile, `mode = "nspawn"`, `mode = "vm"`)
		}, want{mainFile, 2, "mode", `must be one of nspawn, container, none, got "vm"`}},
		{"api-server over http", func(h *host) {
			h.edit(mainFile, `"https://127.0.0.1:1"`, `"http://x"`)
		}, want{mainFile, 5, "cluster.api-server", `must be an https:// URL, got "http://x": scheme http`}},
		{"api-server without host", func(h *host) {
			h.edit(mainFile, `"https://127.0.0.1:1"`, `"https:///api"`)
		}, want{mainFile, 5, "cluster.api-server", "no host"}},
		{"api-server not a URL", func(h *host) {
			h.edit(mainFile, `"https://127.0.0.1:1"`, `"127.0.0.1:1"`)
		}, want{mainFile, 5, "cluster.api-server", "must be an https:// URL"}},
		{"CA file missing", func(h *host) {
			h.edit(mainFile, `ca-file = "/etc/unbounded/ca.crt"`, `ca-file = "/etc/unbounded/other.crt"`)
		}, want{mainFile, 6, "cluster.ca-file", "cannot read CA file /etc/unbounded/other.crt (under root "}},
		{"CA file unreadable: a directory", func(h *host) {
			os.Remove(h.path("/etc/unbounded/ca.crt"))
			os.Mkdir(h.path("/etc/unbounded/ca.crt"), 0o755)
		}, want{mainFile, 6, "cluster.ca-file", "not a regular file"}},
		{"CA file not PEM", func(h *host) {
			h.write("/etc/unbounded/ca.crt", "not a certificate\n", 0o644)
		}, want{mainFile, 6, "cluster.ca-file", "holds no PEM certificate"}},
		{"CA file holding a private key", func(h *host) {
			h.write("/etc/unbounded/ca.crt", string(caPEM)+"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", 0o644)
		}, want{mainFile, 6, "cluster.ca-file", `"PRIVATE KEY" PEM block`}},
		{"CA certificate that does not parse", func(h *host) {
			h.write("/etc/unbounded/ca.crt", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", 0o644)
		}, want{mainFile, 6, "cluster.ca-file", "certificate 1 does not parse"}},
		{"CA file path relative", func(h *host) {
			h.edit(mainFile, `ca-file = "/etc/unbounded/ca.crt"`, `ca-file = "ca.crt"`)
		}, want{mainFile, 6, "cluster.ca-file", `must be an absolute path, got "ca.crt"`}},
		{"token file missing", func(h *host) {
			os.Remove(h.path("/etc/unbounded/bootstrap-token"))
		}, want{mainFile, 7, "cluster.bootstrap-token-file", "no such file"}},
		{"token file at its default path missing", func(h *host) {
			h.edit(mainFile, "bootstrap-token-file = \"/etc/unbounded/bootstrap-token\"\n", "")
			os.Remove(h.path("/etc/unbounded/bootstrap-token"))
		}, want{mainFile, 0, "cluster.bootstrap-token-file", "/etc/unbounded/bootstrap-token (under root"}},
		{"token file not a regular file", func(h *host) {
			os.Remove(h.path("/etc/unbounded/bootstrap-token"))
			os.Mkdir(h.path("/etc/unbounded/bootstrap-token"), 0o700)
		}, want{mainFile, 7, "cluster.bootstrap-token-file", "is not a regular file"}},
		{"token file readable by group", func(h *host) {
			os.Chmod(h.path("/etc/unbounded/bootstrap-token"), 0o640)
		}, want{mainFile, 7, "cluster.bootstrap-token-file", "has mode 0640; it holds a secret and must be 0600 or stricter"}},
		{"token file readable by all", func(h *host) {
			os.Chmod(h.path("/etc/unbounded/bootstrap-token"), 0o644)
		}, want{mainFile, 7, "cluster.bootstrap-token-file", "has mode 0644"}},
		{"token file owned by another user", func(h *host) {
			if err := os.Chown(h.path("/etc/unbounded/bootstrap-token"), os.Geteuid()+4242, -1); err != nil {
				tiers.Skip(h.t, tiers.Unit, "cannot give the token file to another user (needs root): %v", err)
			}
		}, want{mainFile, 7, "cluster.bootstrap-token-file", "must be owned by uid"}},
		{"token malformed", func(h *host) {
			h.write("/etc/unbounded/bootstrap-token", "ABCDEF.0123456789abcdef\n", 0o600)
		}, want{mainFile, 7, "cluster.bootstrap-token-file", "does not hold a bootstrap token of the form [a-z0-9]{6}.[a-z0-9]{16}"}},
		{"token empty", func(h *host) {
			h.write("/etc/unbounded/bootstrap-token", "\n", 0o600)
		}, want{mainFile, 7, "cluster.bootstrap-token-file", "is empty"}},
		{"kubernetes-version not a version", func(h *host) {
			h.edit(mainFile, `kubernetes-version = "1.36.3"`, `kubernetes-version = "latest"`)
		}, want{mainFile, 8, "cluster.kubernetes-version", `got "latest"`}},
		{"kubernetes-version two parts", func(h *host) {
			h.edit(mainFile, `kubernetes-version = "1.36.3"`, `kubernetes-version = "1.36"`)
		}, want{mainFile, 8, "cluster.kubernetes-version", `MAJOR.MINOR.PATCH`}},
		{"cluster-dns not an IP", func(h *host) {
			h.edit(mainFile, `cluster-dns = "10.96.0.10"`, `cluster-dns = "dns.example"`)
		}, want{mainFile, 9, "cluster.cluster-dns", `must be an IP address, got "dns.example"`}},
		{"label key invalid", func(h *host) {
			h.edit(mainFile, "[artifacts]", "[node.labels]\n\"bad key!\" = \"x\"\n\n[artifacts]")
			h.edit(mainFile, `labels = { "topology.kubernetes.io/zone" = "edge-1" }`+"\n", "")
		}, want{mainFile, 15, `node.labels."bad key!"`, `label key "bad key!" is invalid`}},
		{"label value invalid", func(h *host) {
			h.edit(mainFile, `"edge-1"`, `"edge 1"`)
		}, want{mainFile, 12, `node.labels."topology.kubernetes.io/zone"`, `label value "edge 1" is invalid`}},
		{"label in a namespace the kubelet may not set", func(h *host) {
			h.edit(mainFile, `"topology.kubernetes.io/zone"`, `"node-role.kubernetes.io/worker"`)
		}, want{mainFile, 12, `node.labels."node-role.kubernetes.io/worker"`, "reserved namespace node-role.kubernetes.io"}},
		{"taint without effect", func(h *host) {
			h.edit(mainFile, `"dedicated=gpu:NoSchedule"`, `"dedicated=gpu"`)
		}, want{mainFile, 13, "node.taints", `element 1: taint "dedicated=gpu" must be key=value:Effect or key:Effect`}},
		{"taint with unknown effect", func(h *host) {
			h.edit(mainFile, `"dedicated=gpu:NoSchedule"`, `"a:NoSchedule", "b=c:Sometimes"`)
		}, want{mainFile, 13, "node.taints", "element 2: taint \"b=c:Sometimes\": effect must be one of NoSchedule"}},
		{"taint key invalid", func(h *host) {
			h.edit(mainFile, `"dedicated=gpu:NoSchedule"`, `"-x=y:NoExecute"`)
		}, want{mainFile, 13, "node.taints", "key is invalid"}},
		{"taint repeated", func(h *host) {
			h.edit(mainFile, `"dedicated=gpu:NoSchedule"`, `"a=1:NoSchedule", "a=2:NoSchedule"`)
		}, want{mainFile, 13, "node.taints", "element 2: taint a:NoSchedule repeats element 1"}},
		{"base-url not http", func(h *host) {
			h.edit(mainFile, `"https://artifacts.example.internal"`, `"ftp://artifacts"`)
		}, want{mainFile, 16, "artifacts.base-url", `must be an http:// or https:// URL, got "ftp://artifacts"`}},
		{"unknown subsection", func(h *host) {
			h.edit(mainFile, "[allocation]", "[artifacts.x]\n[allocation]")
		}, want{mainFile, 18, "artifacts.x", "unknown key"}},
		{"offline-dir relative", func(h *host) {
			h.edit(mainFile, "base-url = \"https://artifacts.example.internal\"\n", "base-url = \"https://artifacts.example.internal\"\noffline-dir = \"offline\"\n")
		}, want{mainFile, 17, "artifacts.offline-dir", `must be an absolute path, got "offline"`}},
		{"override without url and with a bad checksum", func(h *host) {
			h.edit(mainFile, "[allocation]", "[artifacts.overrides.kubelet]\nsha256 = \"abc\"\n[allocation]")
		}, want{mainFile, 19, "artifacts.overrides.kubelet.sha256", "64 hex digits"}},
		{"allocation uid not a UUID", func(h *host) {
			h.edit(mainFile, `uid = ""`, `uid = "alloc-7"`)
		}, want{mainFile, 19, "allocation.uid", `(a UUID), got "alloc-7"`}},
		{"allocation name without uid", func(h *host) {
			h.edit(mainFile, `uid = ""`, `name = "alloc-7"`)
		}, want{mainFile, 19, "allocation.name", "allocation.uid is not"}},
		{"log level unknown", func(h *host) {
			h.edit(mainFile, "[allocation]", "[daemon]\nlog-level = \"verbose\"\n[allocation]")
		}, want{mainFile, 19, "daemon.log-level", `got "verbose"`}},
		{"metrics address a name", func(h *host) {
			h.edit(mainFile, "[allocation]", "[daemon]\nmetrics-address = \"localhost:9464\"\n[allocation]")
		}, want{mainFile, 19, "daemon.metrics-address", `got "localhost:9464"`}},
		{"metrics address without a port", func(h *host) {
			h.edit(mainFile, "[allocation]", "[daemon]\nmetrics-address = \"127.0.0.1\"\n[allocation]")
		}, want{mainFile, 19, "daemon.metrics-address", `got "127.0.0.1"`}},
		{"metrics address port 0", func(h *host) {
			h.edit(mainFile, "[allocation]", "[daemon]\nmetrics-address = \":0\"\n[allocation]")
		}, want{mainFile, 19, "daemon.metrics-address", "a port from 1 to 65535"}},
		{"drop-in value named in the drop-in", func(h *host) {
			h.write(dropinDir+"/10-cluster.toml", "# moved cluster\n[cluster]\napi-server = \"http://x\"\n", 0o644)
		}, want{dropinDir + "/10-cluster.toml", 3, "cluster.api-server", `must be an https:// URL, got "http://x"`}},
		{"drop-in syntax error named in the drop-in", func(h *host) {
			h.write(dropinDir+"/20-x.toml", "\n\n[node x]\n", 0o644)
		}, want{dropinDir + "/20-x.toml", 3, "", "invalid TOML"}},
		{"drop-in unknown key", func(h *host) {
			h.write(dropinDir+"/30-x.toml", "[cluster]\ncadata = \"x\"\n", 0o644)
		}, want{dropinDir + "/30-x.toml", 2, "cluster.cadata", "unknown key"}},
		{"drop-in directory unreadable: a file", func(h *host) {
			h.write(dropinDir, "", 0o644)
		}, want{dropinDir, 0, "", "cannot read drop-in directory"}},
		{"main file not a regular file", func(h *host) {
			os.Remove(h.path(mainFile))
			os.Mkdir(h.path(mainFile), 0o755)
		}, want{mainFile, 0, "", "is a directory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			tc.setup(h)
			_, errs := h.load()
			if errs == nil {
				t.Fatal("invalid config accepted")
			}
			w := tc.want
			for _, e := range errs {
				if e.File == h.path(w.file) && e.Line == w.line && e.Key == w.key && strings.Contains(e.Msg, w.msg) {
					// The formatted message is what an operator reads.
					s := e.Error()
					prefix := h.path(w.file)
					if w.line > 0 {
						prefix += ":" + strconv.Itoa(w.line)
					}
					if !strings.HasPrefix(s, prefix+": ") || (w.key != "" && !strings.Contains(s, ": "+w.key+": ")) {
						t.Errorf("formatted error %q does not start with %q and name %q", s, prefix, w.key)
					}
					return
				}
			}
			t.Errorf("no error %+v among:\n%v", w, errs)
		})
	}
}

func TestLoadReportsEveryErrorNotJustTheFirst(t *testing.T) {
	h := newHost(t)
	h.edit(mainFile, `mode = "nspawn"`, `mode = "vm"`)
	h.edit(mainFile, `"https://127.0.0.1:1"`, `"http://x"`)
	h.edit(mainFile, `cluster-dns = "10.96.0.10"`, `cluster-dns = 10`)
	h.edit(mainFile, "[allocation]", "[allocation]\nbogus = 1")
	os.Chmod(h.path("/etc/unbounded/bootstrap-token"), 0o644)
	_, errs := h.load()
	keys := map[string]bool{}
	for _, e := range errs {
		keys[e.Key] = true
	}
	for _, k := range []string{"mode", "cluster.api-server", "cluster.cluster-dns", "allocation.bogus", "cluster.bootstrap-token-file"} {
		if !keys[k] {
			t.Errorf("no error for %s among:\n%v", k, errs)
		}
	}
	if len(errs) != 5 {
		t.Errorf("want exactly 5 errors (a wrong type is not reported again as invalid), got %d:\n%v", len(errs), errs)
	}
}

func TestLoadWithoutAnyConfigFileWrapsNotExist(t *testing.T) {
	h := newHost(t)
	os.Remove(h.path(mainFile))
	_, errs := h.load()
	if !errors.Is(errs, fs.ErrNotExist) {
		t.Errorf("error does not wrap fs.ErrNotExist: %v", errs)
	}
	if len(errs) != 1 || errs[0].File != h.path(mainFile) {
		t.Errorf("want one error naming %s, got %v", h.path(mainFile), errs)
	}
}

func TestLoadErrorsNeverQuoteTheTokenEvenWhenMalformed(t *testing.T) {
	h := newHost(t)
	const secretish = "Zq9secretvalue.notatoken"
	h.write("/etc/unbounded/bootstrap-token", secretish, 0o600)
	_, errs := h.load()
	if errs == nil {
		t.Fatal("malformed token accepted")
	}
	if strings.Contains(errs.Error(), secretish) || strings.Contains(errs.Error(), "secretvalue") {
		t.Errorf("error quotes the token file's content: %v", errs)
	}
}

// An unknown key says what the operator most likely meant, and the error
// still names file, line and key.
func TestUnknownKeyHints(t *testing.T) {
	for _, tc := range []struct {
		name       string
		setup      func(h *host)
		line       int
		key, exact string
	}{
		{"misspelt key in a section", func(h *host) {
			h.edit(mainFile, "[cluster]\n", "[cluster]\napi-servr = \"https://x\"\n")
		}, 5, "cluster.api-servr", `unknown key; did you mean "api-server"?`},
		{"misspelt top-level key", func(h *host) {
			h.edit(mainFile, "mode = \"nspawn\"\n", "mode = \"nspawn\"\nmachin = \"x\"\n")
		}, 3, "machin", `unknown key; did you mean "machine"?`},
		{"section key at the top level", func(h *host) {
			h.edit(mainFile, "mode = \"nspawn\"\n", "mode = \"nspawn\"\nlog-level = \"debug\"\n")
		}, 3, "log-level", "unknown key: log-level belongs in [daemon]"},
		{"top-level key below a section header", func(h *host) {
			h.edit(mainFile, "[allocation]\n", "[allocation]\nmode = \"none\"\n")
		}, 19, "allocation.mode", "unknown key: mode belongs at the top level (above the first [section] header)"},
		{"key of another section", func(h *host) {
			h.edit(mainFile, "[allocation]\n", "[allocation]\nretry-budget = \"1m\"\n")
		}, 19, "allocation.retry-budget", "unknown key: retry-budget belongs in [fence]"},
		{"misspelt key of another section", func(h *host) {
			h.edit(mainFile, "mode = \"nspawn\"\n", "mode = \"nspawn\"\ncluster-dsn = \"10.96.0.10\"\n")
		}, 3, "cluster-dsn", "unknown key; did you mean cluster.cluster-dns (in [cluster])?"},
		{"nothing near", func(h *host) {
			h.edit(mainFile, "mode = \"nspawn\"\n", "mode = \"nspawn\"\ncolour = 1\n")
		}, 3, "colour", "unknown key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			tc.setup(h)
			_, errs := h.load()
			for _, e := range errs {
				if e.Key == tc.key {
					if e.File != h.path(mainFile) || e.Line != tc.line || e.Msg != tc.exact {
						t.Errorf("got %s:%d: %s: %q, want line %d and %q", e.File, e.Line, e.Key, e.Msg, tc.line, tc.exact)
					}
					return
				}
			}
			t.Errorf("no error for %s among:\n%v", tc.key, errs)
		})
	}
}

// "No config" says where to start one.
func TestNoConfigPointsAtTheReferenceAndTheExample(t *testing.T) {
	h := newHost(t)
	os.Remove(h.path(mainFile))
	_, errs := h.load()
	if len(errs) != 1 {
		t.Fatalf("want one error, got %v", errs)
	}
	for _, want := range []string{"no such file", "unbounded config check --reference", "/usr/share/doc/unbounded-agent/agent.toml.example"} {
		if !strings.Contains(errs[0].Error(), want) {
			t.Errorf("%q lacks %q", errs[0].Error(), want)
		}
	}
}
