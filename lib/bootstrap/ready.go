package bootstrap

import (
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

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/sdstatus"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// KubeletHealthz is the kubelet's health endpoint as lib/modes/nodestack
// configures it (healthzBindAddress 127.0.0.1, port 10248). Both modes run
// the node stack in the host's network namespace, so the host reaches it.
const KubeletHealthz = "http://127.0.0.1:10248/healthz"

// KubeletClientCert is the kubelet's client certificate and key (one PEM
// file, a link to the current pair), written by its TLS bootstrap into its
// default --cert-dir, as the node stack sees its own file system.
const KubeletClientCert = "/var/lib/kubelet/pki/kubelet-client-current.pem"

// NodeStatus is what the API server says about the Node.
type NodeStatus struct {
	Registered bool
	Ready      bool
	// Detail is the Ready condition's reason and message when not ready.
	Detail string
}

// DefaultCSINodeGrace: see ready.
const DefaultCSINodeGrace = 15 * time.Second

// csiNodePending says whether a NotReady Node's detail is the kubelet's
// "CSINode is not yet initialized" (or "failed to initialize CSINode").
func csiNodePending(detail string) bool { return strings.Contains(detail, "CSINode") }

// ready waits, bounded, until the slot's supervising units are active,
// kubelet's healthz answers ok, and the Node is registered and Ready.
//
// One upstream race is worked around here. The kubelet initializes its
// CSINode object (which needs its Node) at about 0.4, 0.8, 1.4, 4 and 20 s
// after it starts, then once more two minutes later, then exits
// (k8s.io/kubernetes pkg/volume/csi/csi_plugin.go); until then the Node
// is NotReady. A kubelet that registers its Node after its early tries
// (TLS bootstrap, then its container manager, then the next status tick)
// leaves the node NotReady for about two and a half minutes; here that is
// about half of the first boots, the Node registering about 20 s after
// the kubelet starts (its container manager needs 10 s). The Node is seen
// registered at the earliest about 10 s after the kubelet starts, so 15 s
// later the kubelet's last early try is behind it. When the Node is
// registered and still waits for its CSINode after CSINodeGrace,
// the mode restarts the node stack once (its soft restart, never the
// host): the new kubelet finds its Node and initializes at once.
func (b *Bootstrap) ready(ctx context.Context, cfg *config.Config, slot string, m restarter) error {
	timeout := b.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	interval := b.PollInterval
	if interval <= 0 {
		interval = 2 * time.Second
	}
	b.status("phase %s: waiting (at most %s) for the node units, kubelet healthz and Node %s Ready", PhaseReady, timeout, cfg.Machine)
	probe := b.probe(cfg, slot)
	sd, err := b.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()

	grace := b.CSINodeGrace
	if grace <= 0 {
		grace = DefaultCSINodeGrace
	}
	var csiSince time.Time // when the Node was first seen waiting for its CSINode
	restarted := false
	began := time.Now()
	// overdue: the kubelet was started just before this wait, and its
	// early CSINode tries are behind it (CSINodeAfterStart).
	overdue := func() bool { return b.CSINodeAfterStart > 0 && time.Since(began) >= b.CSINodeAfterStart }

	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var missing []string
	var lastNodeErr error
	for {
		missing, lastNodeErr = nil, nil
		for _, u := range unitnames.Supervising(cfg.Mode, slot) {
			st, err := sd.ActiveState(ctx, u)
			if err != nil {
				st = err.Error()
			}
			if st != "active" {
				missing = append(missing, fmt.Sprintf("unit %s active (it is %s)", u, st))
			}
		}
		if err := probe.Healthz(ctx); err != nil {
			missing = append(missing, fmt.Sprintf("kubelet healthz %s ok (%v)", KubeletHealthz, err))
		}
		ns, err := probe.Node(ctx)
		switch {
		case err != nil:
			lastNodeErr = err
			missing = append(missing, fmt.Sprintf("Node %s registered and Ready (%v)", cfg.Machine, err))
		case !ns.Registered:
			missing = append(missing, fmt.Sprintf("Node %s registered", cfg.Machine))
		case !ns.Ready:
			missing = append(missing, fmt.Sprintf("Node %s Ready (%s)", cfg.Machine, ns.Detail))
		}
		switch {
		case err != nil || !ns.Registered || ns.Ready || !csiNodePending(ns.Detail):
			csiSince = time.Time{}
		case csiSince.IsZero():
			csiSince = time.Now()
		case !restarted && (time.Since(csiSince) >= grace || overdue()) && m != nil:
			restarted = true
			b.log().Warn("the kubelet's CSINode is not initialized and its next try is minutes away; restarting the node stack once",
				"node", cfg.Machine, "slot", slot, "waited", time.Since(csiSince).Round(time.Second), "detail", ns.Detail)
			b.notifyOnly(fmt.Sprintf("STATUS=phase %s: restarting the node stack once (the kubelet's CSINode was not initialized)", PhaseReady))
			if err := m.Restart(ctx, slot); err != nil {
				return fmt.Errorf("restart of the node stack (the kubelet's CSINode was not initialized): %w", err)
			}
			csiSince = time.Time{}
			continue
		}
		if len(missing) == 0 {
			b.log().Info("node up", "node", cfg.Machine)
			return nil
		}
		b.notifyOnly(fmt.Sprintf("STATUS=phase %s: waiting for %s", PhaseReady, missing[0]))
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: stopped while waiting for the node; still missing: %s", exitcode.ErrTemporary, strings.Join(missing, "; "))
		case <-deadline.C:
			err := fmt.Errorf("node not up within %s; still missing: %s", timeout, strings.Join(missing, "; "))
			if lastNodeErr != nil && (kube.NoAnswer(lastNodeErr) && !kube.Untrusted(lastNodeErr)) && len(missing) == 1 {
				// Everything on the host is up and only the API
				// server does not answer: a retry may succeed.
				return fmt.Errorf("%w: %w", exitcode.ErrTemporary, err)
			}
			return err
		case <-time.After(interval):
		}
	}
}

// restarter is the mode's soft restart of the node stack.
type restarter interface {
	Restart(ctx context.Context, slot string) error
}

func (b *Bootstrap) notifyOnly(state string) { sdstatus.Notify(b.Notify, state) }

func (b *Bootstrap) probe(cfg *config.Config, slot string) Probe {
	var p Probe
	if b.Probe != nil {
		p = b.Probe(cfg, cfg.Mode, slot)
	}
	if p.Healthz == nil {
		p.Healthz = healthz
	}
	if p.Node == nil {
		r := &NodeReader{
			Name:     cfg.Machine,
			Server:   cfg.Cluster.APIServer,
			CAFile:   cfg.Resolve(cfg.Cluster.CAFile),
			CertFile: KubeletCertFile(b.Paths, cfg.Mode, slot),
			Root:     NodeRoot(b.Paths, cfg.Mode, slot),
		}
		p.Node = r.Read
	}
	return p
}

var healthClient = &http.Client{Timeout: 5 * time.Second}

func healthz(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, KubeletHealthz, nil)
	if err != nil {
		return err
	}
	resp, err := healthClient.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
		return fmt.Errorf("HTTP %d %q", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}

// NodeRoot is the root of the node stack's file system on the host: the
// machine's rootfs in the nspawn mode, the host's own root in the none
// mode.
func NodeRoot(p hostpaths.Paths, mode, slot string) string {
	if mode == "nspawn" {
		return p.MachineDir(slot)
	}
	return p.Join("/")
}

// KubeletCertFile is KubeletClientCert as the host sees it.
func KubeletCertFile(p hostpaths.Paths, mode, slot string) string {
	return filepath.Join(NodeRoot(p, mode, slot), KubeletClientCert)
}

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
func (r *NodeReader) Read(ctx context.Context) (NodeStatus, error) {
	pemData, err := r.readCert()
	if err != nil {
		return NodeStatus{}, err
	}
	ca, err := regfile.Read(r.CAFile, 1<<20)
	if err != nil {
		return NodeStatus{}, fmt.Errorf("cluster CA: %w", err)
	}
	cfg := &rest.Config{
		Host:            r.Server,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: pemData, KeyData: pemData},
		Timeout:         10 * time.Second,
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return NodeStatus{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(r.Server, "/")+"/api/v1/nodes/"+url.PathEscape(r.Name), nil)
	if err != nil {
		return NodeStatus{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return NodeStatus{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return NodeStatus{}, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return NodeStatus{}, nil
	default:
		return NodeStatus{}, fmt.Errorf("GET node %s: HTTP %d: %s", r.Name, resp.StatusCode, truncate(strings.TrimSpace(string(body)), 300))
	}
	var n corev1.Node
	if err := json.Unmarshal(body, &n); err != nil {
		return NodeStatus{}, fmt.Errorf("GET node %s: %w", r.Name, err)
	}
	st := NodeStatus{Registered: true, Detail: "no Ready condition yet"}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			st.Ready = c.Status == corev1.ConditionTrue
			st.Detail = fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
		}
	}
	return st, nil
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

// WaitReady is the ready phase's bounded wait (units active, kubelet
// healthz, Node registered and Ready, with the one CSINode restart through
// m), for the other integrators that start a node stack (lib/repave's
// health hook). b's ReadyTimeout, PollInterval, CSINodeGrace, Probe,
// Systemd, Notify and Log apply.
func (b *Bootstrap) WaitReady(ctx context.Context, cfg *config.Config, slot string, m modes.Mode) error {
	return b.ready(ctx, cfg, slot, m)
}

// RunFence starts unbounded-fence.service and waits for its verdict, as
// the fence phase does: nil is allowed; a refusal wraps
// exitcode.ErrRefused (77), a config error exitcode.ErrConfigInvalid.
func (b *Bootstrap) RunFence(ctx context.Context) error { return b.fence(ctx) }
