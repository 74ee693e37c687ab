package adopt

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sort"
	"strings"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/regfile"
)

// legacyConfig is the older agent's applied config: the agent config it
// was started with, written as it was (json.MarshalIndent of its
// AgentConfig) once the node ran. Its fields over the older agent's
// releases are the union below; a key outside it is refused, never
// ignored: a field this agent does not know might be one that changes
// what the node is.
type legacyConfig struct {
	MachineName string `json:"MachineName"`
	// NodeName, in some releases, is the Node's name when it is not
	// the machine's.
	NodeName string `json:"NodeName"`
	Cluster  struct {
		CaCertBase64 string `json:"CaCertBase64"`
		ClusterDNS   string `json:"ClusterDNS"`
		Version      string `json:"Version"`
	} `json:"Cluster"`
	Kubelet struct {
		ApiServer string `json:"ApiServer"`
		// BootstrapToken (older releases) or Auth.BootstrapToken: a
		// secret, never read into this agent's state.
		BootstrapToken     string            `json:"BootstrapToken"`
		Labels             map[string]string `json:"Labels"`
		RegisterWithTaints []string          `json:"RegisterWithTaints"`
		Auth               struct {
			BootstrapToken string          `json:"BootstrapToken"`
			ExecCredential json.RawMessage `json:"ExecCredential"`
		} `json:"Auth"`
	} `json:"Kubelet"`
	CRI struct {
		Containerd struct {
			Version string `json:"Version"`
		} `json:"Containerd"`
		Runc struct {
			Version string `json:"Version"`
		} `json:"Runc"`
	} `json:"CRI"`
	CNI struct {
		PluginVersion string `json:"PluginVersion"`
	} `json:"CNI"`
	OCIImage string          `json:"OCIImage"`
	Attest   json.RawMessage `json:"Attest"`
}

// obj is a JSON object's keys in the older format; a nil value is a leaf
// (any JSON value: its type is checked by decoding).
type obj map[string]obj

var legacySchema = obj{
	"MachineName": nil, "NodeName": nil, "OCIImage": nil, "Attest": nil,
	"Cluster": {"CaCertBase64": nil, "ClusterDNS": nil, "Version": nil},
	"Kubelet": {"ApiServer": nil, "BootstrapToken": nil, "Labels": nil, "RegisterWithTaints": nil,
		"Auth": {"BootstrapToken": nil, "ExecCredential": nil}},
	"CRI": {"Containerd": {"Version": nil}, "Runc": {"Version": nil}},
	"CNI": {"PluginVersion": nil},
}

// RecordError is an older agent's applied config that this agent cannot
// take over: File is the record (a host path), Key the dotted key in it.
// It is an invalid configuration (exit 78): the operator's answer is a
// fix of the input or a reset, never a retry.
type RecordError struct {
	File, Key, Msg string
}

func (e *RecordError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("%s: key %s: %s", e.File, e.Key, e.Msg)
}

// Is makes a RecordError an invalid configuration (exitcode.For: 78).
func (e *RecordError) Is(target error) bool { return target == exitcode.ErrConfigInvalid }

// decodeLegacy decodes an older agent's applied config, refusing what it
// cannot map. file names it in errors (a host path). No value of a
// secret is ever part of an error.
func decodeLegacy(file string, data []byte) (*legacyConfig, error) {
	if err := checkKeys(file, json.RawMessage(data), legacySchema, ""); err != nil {
		return nil, err
	}
	var lc legacyConfig
	if err := json.Unmarshal(data, &lc); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, &RecordError{File: file, Key: te.Field, Msg: fmt.Sprintf("a JSON %s where the older agent wrote a %s", te.Value, te.Type)}
		}
		return nil, &RecordError{File: file, Msg: "not the older agent's applied config: " + err.Error()}
	}
	switch {
	case lc.MachineName == "":
		return nil, &RecordError{File: file, Key: "MachineName", Msg: "missing: the record names no machine"}
	case lc.NodeName != "" && lc.NodeName != lc.MachineName:
		return nil, &RecordError{File: file, Key: "NodeName", Msg: fmt.Sprintf("the Node is %q, the machine %q: this agent names the Node after its machine and cannot manage a Node of another name (reset the host and bootstrap it again)", lc.NodeName, lc.MachineName)}
	case present(lc.Kubelet.Auth.ExecCredential):
		return nil, &RecordError{File: file, Key: "Kubelet.Auth.ExecCredential", Msg: "the node authenticates through an exec credential plugin; this agent joins and fences with a bootstrap token file (cluster.bootstrap-token-file) only"}
	case present(lc.Attest):
		return nil, &RecordError{File: file, Key: "Attest", Msg: "the node got its bootstrap token by TPM attestation, which this agent does not do: it reads the token from cluster.bootstrap-token-file"}
	case lc.Kubelet.ApiServer == "":
		return nil, &RecordError{File: file, Key: "Kubelet.ApiServer", Msg: "missing: the record names no API server"}
	}
	return &lc, nil
}

func present(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null"))
}

// checkKeys refuses a key the older format does not have, naming it.
func checkKeys(file string, raw json.RawMessage, schema obj, prefix string) error {
	if !present(raw) {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		key := strings.TrimSuffix(prefix, ".")
		if key == "" {
			return &RecordError{File: file, Msg: "not a JSON object (the older agent's applied config is one): " + err.Error()}
		}
		return &RecordError{File: file, Key: key, Msg: "not a JSON object"}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		sub, known := schema[k]
		if !known {
			return &RecordError{File: file, Key: prefix + k, Msg: "unknown to this agent, which cannot tell what it changed on the node: nothing adopted (reset the host and bootstrap it again, or remove the key if it is known to be harmless)"}
		}
		if sub != nil {
			if err := checkKeys(file, m[k], sub, prefix+k+"."); err != nil {
				return err
			}
		}
	}
	return nil
}

// check compares the older record with the operator's configuration where
// both name the same thing and a difference means another cluster or
// another Node: then this agent would manage the node against the wrong
// one. cfgFile names the configuration in messages.
func check(file string, lc *legacyConfig, cfg *config.Config, cfgFile string) error {
	if cfg.Machine != lc.MachineName {
		return &RecordError{File: file, Key: "MachineName", Msg: fmt.Sprintf("the node is machine %q, but %s (machine) says %q: this agent would manage it as another Machine (set machine = %q, or reset the host)", lc.MachineName, cfgFile, cfg.Machine, lc.MachineName)}
	}
	want, err := apiEndpoint(lc.Kubelet.ApiServer)
	if err != nil {
		return &RecordError{File: file, Key: "Kubelet.ApiServer", Msg: err.Error()}
	}
	have, err := apiEndpoint(cfg.Cluster.APIServer)
	if err != nil || have != want {
		return &RecordError{File: file, Key: "Kubelet.ApiServer", Msg: fmt.Sprintf("the node joined %s, but %s (cluster.api-server) says %s: this agent would manage it against another cluster", lc.Kubelet.ApiServer, cfgFile, cfg.Cluster.APIServer)}
	}
	if lc.Cluster.CaCertBase64 == "" {
		return nil
	}
	pemData, err := base64.StdEncoding.DecodeString(strings.TrimSpace(lc.Cluster.CaCertBase64))
	if err != nil {
		return &RecordError{File: file, Key: "Cluster.CaCertBase64", Msg: "not base64: " + err.Error()}
	}
	older := certificates(pemData)
	if len(older) == 0 {
		return &RecordError{File: file, Key: "Cluster.CaCertBase64", Msg: "holds no PEM certificate"}
	}
	caFile := cfg.Resolve(cfg.Cluster.CAFile)
	data, err := regfile.Read(caFile, 4<<20)
	if err != nil {
		return fmt.Errorf("%w: %s (cluster.ca-file): %v", exitcode.ErrConfigInvalid, cfg.Cluster.CAFile, err)
	}
	ours := certificates(data)
	for _, c := range older {
		if !slices.ContainsFunc(ours, func(o []byte) bool { return bytes.Equal(o, c) }) {
			return &RecordError{File: file, Key: "Cluster.CaCertBase64", Msg: fmt.Sprintf("the node trusts a cluster CA certificate that %s (cluster.ca-file in %s) does not hold: this agent would talk to another cluster than the node's", cfg.Cluster.CAFile, cfgFile)}
		}
	}
	return nil
}

// certificates are the DER bytes of data's CERTIFICATE blocks.
func certificates(data []byte) [][]byte {
	var out [][]byte
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		if b.Type == "CERTIFICATE" {
			out = append(out, b.Bytes)
		}
	}
}

// apiEndpoint is an API server's address as "host:port": the older
// agent took "host:port" or a URL, https implied, port 443 by default.
func apiEndpoint(s string) (string, error) {
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("%q is no API server address", s)
	}
	if u.Scheme != "https" {
		return "", fmt.Errorf("%q: the API server is reached over https only", s)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port), nil
}

// effective is the config the node runs as this agent's applied record
// keeps it (lib/repave compares the desired config with it): the
// operator's configuration, with what the older record says the node
// runs laid over it where it says it. Secrets stay out: the token is
// cluster.bootstrap-token-file's, as for every node of this agent.
func effective(lc *legacyConfig, cfg *config.Config) ([]byte, string) {
	c := *cfg
	c.Files = nil
	// The older agent ran its nodes in nspawn machines only.
	c.Mode = "nspawn"
	version := strings.TrimPrefix(lc.Cluster.Version, "v")
	if version != "" {
		c.Cluster.KubernetesVersion = version
	}
	if lc.Cluster.ClusterDNS != "" {
		c.Cluster.ClusterDNS = lc.Cluster.ClusterDNS
	}
	if lc.Kubelet.Labels != nil {
		c.Node.Labels = lc.Kubelet.Labels
	}
	if lc.Kubelet.RegisterWithTaints != nil {
		c.Node.Taints = lc.Kubelet.RegisterWithTaints
	}
	if v := lc.CRI.Containerd.Version; v != "" {
		c.Artifacts.ContainerdVersion = strings.TrimPrefix(v, "v")
	}
	if v := lc.CRI.Runc.Version; v != "" {
		c.Artifacts.RuncVersion = strings.TrimPrefix(v, "v")
	}
	if v := lc.CNI.PluginVersion; v != "" {
		c.Artifacts.CNIPluginsVersion = strings.TrimPrefix(v, "v")
	}
	if lc.OCIImage != "" {
		c.Nspawn.Image = lc.OCIImage
	}
	data, err := json.Marshal(&c)
	if err != nil {
		// config.Config is plain data: this cannot happen.
		panic(err)
	}
	return data, c.Cluster.KubernetesVersion
}
