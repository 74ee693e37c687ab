package kube

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/readiness"
	"unbounded-cloud.io/agent/lib/regfile"
)

// NodeReader reads the Node with the kubelet's own client certificate,
// once its TLS bootstrap is done: the API server's Node authorizer lets a
// kubelet read its own Node (system:node:<name>), so bootstrap needs no
// grant on Nodes for the bootstrap token, and a Node it can read proves
// that the kubelet's identity works.
type NodeReader struct {
	Name, Server, CAFile string
	// CertFile is the kubelet's certificate-and-key PEM on the host;
	// Root is the node stack's root, under which an absolute link in it
	// (the kubelet's "current" link names the dated pair by its absolute
	// path inside the node) is resolved.
	CertFile, Root string
}

// ErrNoKubeletCertificate: the kubelet has not finished its TLS bootstrap
// (its CSR is not approved or not signed yet).
var ErrNoKubeletCertificate = errors.New("the kubelet has no client certificate yet (TLS bootstrap not done: is its CSR approved?)")

// Read returns what the API server says about the Node.
func (r *NodeReader) Read(ctx context.Context) (readiness.Node, error) {
	pemData, err := r.readCert()
	if err != nil {
		return readiness.Node{}, err
	}
	ca, err := regfile.Read(r.CAFile, 1<<20)
	if err != nil {
		return readiness.Node{}, fmt.Errorf("cluster CA: %w", err)
	}
	cfg := &rest.Config{
		Host:            r.Server,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: pemData, KeyData: pemData},
		Timeout:         10 * time.Second,
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return readiness.Node{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(r.Server, "/")+"/api/v1/nodes/"+url.PathEscape(r.Name), nil)
	if err != nil {
		return readiness.Node{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return readiness.Node{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return readiness.Node{}, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return readiness.Node{Known: true}, nil
	default:
		return readiness.Node{}, fmt.Errorf("GET node %s: HTTP %d: %s", r.Name, resp.StatusCode, Truncate(strings.TrimSpace(string(body)), 300))
	}
	var n corev1.Node
	if err := json.Unmarshal(body, &n); err != nil {
		return readiness.Node{}, fmt.Errorf("GET node %s: %w", r.Name, err)
	}
	return Readiness(&n), nil
}

// Readiness is what lib/readiness needs of a Node: whether it exists and
// its Ready condition. The one place a Node's Ready condition is read;
// every reader (the host's checks, the daemon's record, the fleet's roll
// and table) goes through it. A nil Node is a known absent one.
func Readiness(n *corev1.Node) readiness.Node {
	if n == nil {
		return readiness.Node{Known: true}
	}
	st := readiness.Node{Known: true, Present: true}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			st.Ready = c.Status == corev1.ConditionTrue
			st.Status, st.Reason, st.Message = string(c.Status), c.Reason, c.Message
			st.Heartbeat, st.Transition = c.LastHeartbeatTime.Time, c.LastTransitionTime.Time
		}
	}
	return st
}

// ReadyAfter reports whether node is Ready again after op completed.
// Ready=True is not enough where the operation restarts the kubelet
// (repave, restart, reboot): the cluster keeps the Ready of a kubelet
// that stopped until the node monitor's grace passes, and a reboot's
// operation completes when the next boot's daemon starts, before the
// kubelet reports. So its Ready must have been written no earlier than
// the operation's start, as lib/readiness judges it on the host: the
// kubelet writes its Node when it starts. Both times are the host's
// clock (kubelet, daemon), so the workstation's skew does not matter.
// An AgentUpgrade leaves the node alone (README "Agent upgrade"), and its
// unchanged Node may have last been written 5 min ago.
func ReadyAfter(op *v1alpha3.MachineOperation, node *corev1.Node) (bool, string) {
	if node == nil {
		return false, "Node not registered"
	}
	ready := Readiness(node)
	switch {
	case ready.Status == "":
		return false, "Node has no Ready condition yet"
	case !ready.Ready:
		return false, fmt.Sprintf("Node Ready=%s (%s)", ready.Status, cmp.Or(ready.Reason, "<none>"))
	case op.Spec.Operation == v1alpha3.OperationAgentUpgrade || op.Status.StartTime == nil:
		return true, ""
	case ready.Heartbeat.Before(op.Status.StartTime.Time):
		return false, "Node Ready from before the operation started (its kubelet has not reported since)"
	}
	return true, ""
}

// readCert reads the kubelet's PEM, following its link inside Root.
func (r *NodeReader) readCert() ([]byte, error) {
	file := r.CertFile
	for range 4 {
		target, err := os.Readlink(file)
		if err != nil {
			break
		}
		if path.IsAbs(target) {
			file = filepath.Join(r.Root, target)
		} else {
			file = filepath.Join(filepath.Dir(file), target)
		}
	}
	data, err := regfile.Read(file, 1<<20)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoKubeletCertificate
	}
	return data, err
}

// NotUpExit maps the end of a readiness wait on the live Node
// (readiness.Check.Wait) to what the unit should do: nil stays nil; a
// wait the context ended, or one after which everything on the host is up
// and only the API server did not answer, is temporary (a retry may
// succeed, exit 75); anything else a failure.
func NotUpExit(err error) error {
	var nu *readiness.NotUpError
	switch {
	case err == nil || !errors.As(err, &nu):
		return err
	case nu.Err != nil,
		nu.Last.OnlyNodeUnread() && NoAnswer(nu.Last.NodeErr) && !Untrusted(nu.Last.NodeErr):
		return fmt.Errorf("%w: %w", exitcode.ErrTemporary, err)
	}
	return err
}
