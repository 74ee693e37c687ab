package system_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/client-go/util/exec"
	"k8s.io/utils/ptr"

	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// kubectl logs, exec and port-forward against a pod on the node the
// agent's first boot made: the API server reaches the kubelet with its
// client certificate and verifies the kubelet's serving certificate, which
// the kubelet got from the cluster (node.serving-cert = "cluster", the
// default: a kubernetes.io/kubelet-serving CSR the test control plane
// approves as a cluster's approver would). The calls are client-go's, the
// same kubectl makes.
func TestLogsExecAndPortForwardReachAPodOnTheAgentsNode(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{prepared: true})
	begin := time.Now()
	f.m.Start()
	t.Logf("first boot: %v", time.Since(begin).Round(time.Millisecond))
	f.wantBootstrapped(t, "nspawn", "systemd-nspawn@kube1.service")
	if t.Failed() {
		return
	}
	ctx := context.Background()
	c := f.env.kube

	// The serving certificate came from the cluster: a CSR of the node,
	// approved and signed by the cluster CA for the Node's own names.
	certCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	serving, err := nodestack.ServingCert(certCtx, c, f.name, time.Time{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubelet serving certificate: subject %s, DNS %v, IP %v, issuer %s", serving.Subject, serving.DNSNames, serving.IPAddresses, serving.Issuer)
	if err := serving.CheckSignatureFrom(f.env.CACert(t)); err != nil {
		t.Errorf("the serving certificate is not the cluster CA's: %v", err)
	}
	if !containsString(serving.DNSNames, f.name) {
		t.Errorf("the serving certificate names %v, not the Node's hostname %s", serving.DNSNames, f.name)
	}

	ns := newNamespace(t, c, "ns")
	// One container that says hello on stdout and serves the same text
	// over HTTP on 8080 (busybox's httpd).
	script := `busybox mkdir -p /www && echo "hello from $(hostname)" >/www/index.html && echo "hello from $(hostname)" && exec busybox httpd -f -p 8080 -h /www`
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      f.name,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "hello", Image: f.app, Command: []string{"/bin/sh", "-c", script},
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}},
		},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	begin = time.Now()
	waitUntil(t, 150*time.Second, "pod hello Running", func(ctx context.Context) (bool, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, "hello", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	t.Logf("pod Running after %v", time.Since(begin).Round(time.Millisecond))

	// kubectl logs.
	begin = time.Now()
	var logs []byte
	waitUntil(t, 30*time.Second, "the pod's log", func(ctx context.Context) (bool, error) {
		var err error
		logs, err = c.CoreV1().Pods(ns).GetLogs("hello", &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Logf("logs: %v", err)
			return false, nil
		}
		return len(logs) > 0, nil
	})
	if string(logs) != "hello from hello\n" {
		t.Errorf("logs = %q, want %q", logs, "hello from hello\n")
	}
	t.Logf("logs in %v", time.Since(begin).Round(time.Millisecond))

	// kubectl exec: stdout, stderr and the exit code come back.
	begin = time.Now()
	req := c.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name("hello").SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: "hello",
			Command:   []string{"/bin/sh", "-c", "cat /www/index.html; echo to-stderr >&2; exit 3"},
			Stdout:    true, Stderr: true,
		}, scheme.ParameterCodec)
	cfg := f.env.RESTConfig()
	// Over WebSockets, as kubectl execs (it falls back to SPDY only
	// where the API server cannot upgrade), and over SPDY.
	wsExec, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	if err != nil {
		t.Fatal(err)
	}
	spdyExec, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		name string
		e    remotecommand.Executor
	}{{"websocket", wsExec}, {"spdy", spdyExec}} {
		var stdout, stderr bytes.Buffer
		err = x.e.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
		var exitErr exec.CodeExitError
		if !errors.As(err, &exitErr) || exitErr.Code != 3 {
			t.Errorf("exec (%s): %v, want exit code 3", x.name, err)
		}
		if stdout.String() != "hello from hello\n" || stderr.String() != "to-stderr\n" {
			t.Errorf("exec (%s): stdout %q stderr %q", x.name, stdout.String(), stderr.String())
		}
	}
	t.Logf("exec (websocket, spdy) in %v", time.Since(begin).Round(time.Millisecond))

	// kubectl port-forward: a local port to the pod's 8080.
	begin = time.Now()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pfURL := c.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name("hello").SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, "POST", pfURL)
	stop, ready := make(chan struct{}), make(chan struct{})
	defer close(stop)
	var pfOut bytes.Buffer
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:8080"}, stop, ready, &pfOut, &pfOut)
	if err != nil {
		t.Fatal(err)
	}
	pfErr := make(chan error, 1)
	go func() { pfErr <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-pfErr:
		t.Fatalf("port-forward: %v\n%s", err, pfOut.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("port-forward not ready within 30s\n%s", pfOut.String())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		t.Fatalf("port-forward ports %v: %v", ports, err)
	}
	local := net.JoinHostPort("127.0.0.1", fmt.Sprint(ports[0].Local))
	hc := &http.Client{Timeout: 20 * time.Second}
	resp, err := hc.Get((&url.URL{Scheme: "http", Host: local, Path: "/"}).String())
	if err != nil {
		t.Fatalf("GET through port-forward: %v\n%s", err, pfOut.String())
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "hello from hello" {
		t.Errorf("GET through port-forward: %s %q", resp.Status, body)
	}
	t.Logf("port-forward in %v", time.Since(begin).Round(time.Millisecond))
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// node.serving-cert = "self-signed": the kubelet serves with a certificate
// of its own making and asks the cluster for none, and the API server,
// which verifies kubelets, refuses to talk to it: kubectl logs fails with
// a certificate error, not with a timeout or a success. (This is what the
// default, "cluster", is for.)
func TestSelfSignedServingCertIsNotTrustedByAVerifyingAPIServer(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{})
	dropIn := filepath.Join(f.m.Root(), "etc/unbounded/agent.toml.d/50-serving-cert.toml")
	if err := os.MkdirAll(filepath.Dir(dropIn), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dropIn, []byte("[node]\nserving-cert = \"self-signed\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.m.Start()
	f.wantBootstrapped(t, "nspawn", "systemd-nspawn@kube1.service")
	if t.Failed() {
		return
	}
	ns := f.runPod(t)
	ctx := context.Background()
	c := f.env.kube
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods: %v %v", pods, err)
	}
	// The API server's reason is in the body (the error says "unknown").
	body, err := c.CoreV1().Pods(ns).GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err == nil || !strings.Contains(string(body), "x509") {
		t.Errorf("logs from a kubelet with a self-signed serving certificate: %v %q, want a certificate error", err, body)
	} else {
		t.Logf("logs refused as wanted: %s", body)
	}
	csrs, err := c.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, csr := range csrs.Items {
		if csr.Spec.SignerName == certificatesv1.KubeletServingSignerName && csr.Spec.Username == "system:node:"+f.name {
			t.Errorf("the kubelet asked for a serving certificate (%s) although serving-cert is self-signed", csr.Name)
		}
	}
}
