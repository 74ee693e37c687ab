package fence_test

// Every "no" from the cluster counts (ARCHITECTURE section 7), against the
// real API server of tests/kube: a "no" read with the bootstrap token, a refusal recorded
// on the Machine that only a read of the Machine may clear, a rejected
// certificate whose refusal the token records, an API server the cluster
// CA does not verify, and a check interrupted while it retries.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/fence"
	"unbounded-cloud.io/agent/tests/fixtures"
)

// recordRefusal leaves AllocationLaunchRefused=True and phase Refused on
// the Machine, as an earlier refused boot did.
func (h *host) recordRefusal(t *testing.T) {
	t.Helper()
	_, err := h.env.Machines(t).MutateStatus(context.Background(), h.machine, func(m *v1alpha3.Machine) bool {
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: v1alpha3.ConditionAllocationLaunchRefused,
			Status: metav1.ConditionTrue, Reason: v1alpha3.ReasonAllocationFenced, Message: "refused by an earlier boot"})
		m.Status.Phase = v1alpha3.MachineRefused
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (h *host) phase(t *testing.T) v1alpha3.MachinePhase {
	t.Helper()
	m, err := h.env.Machines(t).Get(context.Background(), h.machine)
	if err != nil {
		t.Fatal(err)
	}
	return m.Status.Phase
}

// refusedAtOnce runs the check with a long budget and wants 77 well before
// it, a clear "no" is not retried, for reason.
func (h *host) refusedAtOnce(t *testing.T, c *fence.Check, reason string) {
	t.Helper()
	c.Budget = 30 * time.Second
	code, took, err := h.run(t, c)
	if code != exitcode.Refused || took > 5*time.Second {
		t.Fatalf("exit %d after %s, want 77 at once", code, took)
	}
	wantReason(t, err, reason)
}

// The reviewer's case: no certificate yet, a token that still
// authenticates, and a Machine whose allocation is fenced, with the
// refusal of an earlier boot on it. The old fence allowed on the
// TokenReview and rewrote the condition to False/Allowed.
func TestFenceRefusesAFencedMachineReadWithTheBootstrapTokenAndKeepsItsRefusal(t *testing.T) {
	h := newHost(t, func(m *v1alpha3.Machine) { m.Spec.Allocation.Fenced = true })
	h.recordRefusal(t)
	c := h.check(0)
	h.refusedAtOnce(t, c, v1alpha3.ReasonAllocationFenced)
	wantVia(t, c, fence.ViaToken)
	h.wantRefused(t, v1alpha3.ReasonAllocationFenced)
	if p := h.phase(t); p != v1alpha3.MachineRefused {
		t.Errorf("phase %q, want Refused", p)
	}
}

func TestFenceRefusesADeletingMachineReadWithTheBootstrapToken(t *testing.T) {
	h := newHost(t, func(m *v1alpha3.Machine) { m.Finalizers = []string{"unbounded-cloud.io/test-hold"} })
	if err := h.env.DeleteMachine(h.machine); err != nil {
		t.Fatal(err)
	}
	c := h.check(0)
	h.refusedAtOnce(t, c, v1alpha3.ReasonMachineDeleting)
	wantVia(t, c, fence.ViaToken)
	h.wantRefused(t, v1alpha3.ReasonMachineDeleting)
}

func TestFenceRefusesAMachineOfAnotherAllocationReadWithTheBootstrapToken(t *testing.T) {
	h := newHost(t, nil)
	c := h.check(0)
	c.AllocationUID = "some-other-allocation-uid"
	h.refusedAtOnce(t, c, v1alpha3.ReasonAllocationMismatch)
	wantVia(t, c, fence.ViaToken)
	h.wantRefused(t, v1alpha3.ReasonAllocationMismatch)
}

// A token read that found the allocation bound and unfenced on the Machine
// did confirm it, and clears an earlier refusal.
func TestFenceTokenReadThatConfirmsTheAllocationClearsAnEarlierRefusal(t *testing.T) {
	h := newHost(t, nil)
	h.recordRefusal(t)
	c := h.check(5 * time.Second)
	if code, _, _ := h.run(t, c); code != exitcode.OK {
		t.Fatalf("exit %d, want 0", code)
	}
	wantVia(t, c, fence.ViaToken)
	if c := h.condition(t); c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha3.ReasonAllowed {
		t.Errorf("AllocationLaunchRefused = %+v, want False/Allowed", c)
	}
	if p := h.phase(t); p != v1alpha3.MachinePending {
		t.Errorf("phase %q, want Pending", p)
	}
}

// When RBAC lets the token review itself but not read its Machine: the
// TokenReview alone allows (the documented fallback), and leaves the
// recorded refusal alone.
func TestFenceTokenReviewAloneAllowsButLeavesARecordedRefusal(t *testing.T) {
	h := newHostGrant(t, nil, false)
	h.recordRefusal(t)
	c := h.check(5 * time.Second)
	if code, _, _ := h.run(t, c); code != exitcode.OK {
		t.Fatalf("exit %d, want 0 on the TokenReview", code)
	}
	wantVia(t, c, fence.ViaToken)
	h.wantRefused(t, v1alpha3.ReasonAllocationFenced)
	if p := h.phase(t); p != v1alpha3.MachineRefused {
		t.Errorf("phase %q, want Refused kept", p)
	}
}

// foreignCA is a CA the test cluster does not know: its PEM, and a client
// certificate it signed for cn/orgs (valid now) with its key.
func foreignCA(t *testing.T, cn string, orgs ...string) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "not-the-cluster-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// A stored certificate the API server rejects (401: signed by a CA it does
// not trust) is final, and the refusal is recorded with the bootstrap
// token, which may still write the Machine's status.
func TestFenceRecordsTheRefusalOfARejectedCertificateWithTheBootstrapToken(t *testing.T) {
	h := newHost(t, nil)
	_, cert, key := foreignCA(t, identity.AgentUserName(h.machine), identity.AgentGroup)
	if err := h.creds.Certs.Save(cert, key); err != nil {
		t.Fatal(err)
	}
	c := h.check(0)
	h.refusedAtOnce(t, c, v1alpha3.ReasonCertificateRejected)
	if c.Via() != fence.ViaCertificate {
		t.Errorf("the decision rests on a read with %q, want the rejected certificate's, not a fallback to the token", c.Via())
	}
	h.wantRefused(t, v1alpha3.ReasonCertificateRejected)
	if p := h.phase(t); p != v1alpha3.MachineRefused {
		t.Errorf("phase %q, want Refused", p)
	}
}

// A CA file that does not verify the API server's certificate is a TLS
// trust failure, said as such and naming the file, and refused at once:
// it is not "unreachable", and no retry changes the certificate.
func TestFenceReportsAnUntrustedAPIServerAsSuchNotAsUnreachable(t *testing.T) {
	for _, withCert := range []bool{true, false} {
		name := map[bool]string{true: "certificate", false: "bootstrap token"}[withCert]
		t.Run(name, func(t *testing.T) {
			h := newHost(t, nil)
			if withCert {
				h.validCert(t)
			}
			wrongCA, _, _ := foreignCA(t, "unused")
			h.creds.CAFile = filepath.Join(t.TempDir(), "wrong-ca.crt")
			if err := os.WriteFile(h.creds.CAFile, wrongCA, 0o644); err != nil {
				t.Fatal(err)
			}
			c := h.check(0)
			c.Budget = 30 * time.Second
			retries := countRetries(c)
			err := c.Run(context.Background())
			t.Logf("fence: %v\n%s", err, h.log.String())
			var r *fence.Refusal
			if !errors.As(err, &r) || r.Reason != fence.ReasonServerUntrusted {
				t.Fatalf("Run: %v, want refusal %s", err, fence.ReasonServerUntrusted)
			}
			if !strings.Contains(r.Message, h.creds.CAFile) {
				t.Errorf("message %q does not name the CA file %s", r.Message, h.creds.CAFile)
			}
			if r.NoAnswer {
				t.Error("a TLS trust failure was refused for lack of an answer, as if unreachable")
			}
			if n := retries.Load(); n != 0 {
				t.Errorf("a TLS trust failure was retried %d times", n)
			}
			wantVia(t, c, map[bool]fence.Credential{true: fence.ViaCertificate, false: fence.ViaToken}[withCert])
			h.wantNoCondition(t, "no TLS connection to the cluster was trusted")
		})
	}
}

// SIGTERM (cmd/fence turns it into the cancellation of Run's context,
// with the signal as its cause) while reads are retried: one line, a
// prompt return, nothing recorded on the Machine, and an error that keeps
// the node down without claiming the cluster said no. The log is asserted
// here because the one line is the promise (ARCHITECTURE section 7): it
// is all an interrupted check leaves behind.
func TestFenceInterruptedWhileRetryingLogsOneLineAndFailsClosed(t *testing.T) {
	h := newHost(t, nil)
	h.validCert(t)
	p := h.env.ProxyFront(t)
	h.creds.APIServer = p.Host()
	p.Close()
	var log fixtures.Buffer
	c := h.check(time.Minute)
	c.Log = slog.New(slog.NewTextHandler(&log, nil))
	retries := countRetries(c)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	deadline := time.Now().Add(10 * time.Second)
	for retries.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no retries within 10s:\n%s", log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := log.String()
	cancel(errors.New("signal: terminated"))
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Second):
		t.Fatalf("Run did not return within 2s of the cancellation:\n%s", log.String())
	}
	after := strings.TrimPrefix(log.String(), before)
	t.Logf("fence: %v (exit %d)\nafter the signal:\n%s", err, exitcode.For(err), after)
	if lines := strings.Split(strings.TrimSpace(after), "\n"); len(lines) != 1 || !strings.Contains(after, "signal: terminated") {
		t.Errorf("%d lines after the signal, want exactly one naming it:\n%s", len(lines), after)
	}
	if !errors.Is(err, fence.ErrInterrupted) || exitcode.For(err) == exitcode.OK || exitcode.For(err) == exitcode.Refused {
		t.Errorf("Run: %v (exit %d), want ErrInterrupted: not allowed, and not a refusal by the cluster", err, exitcode.For(err))
	}
	wantVia(t, c, "")
	h.wantNoCondition(t, "the check was interrupted before a decision")
}
