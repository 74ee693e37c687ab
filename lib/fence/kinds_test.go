package fence

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// The two kinds of refusal: an explicit "no" is not NoAnswer; a budget
// spent on an unreachable server is; and a server certificate that is
// not valid at the host's time (a clock far off) is retried within the
// budget like an unreachable server, then refused for lack of an answer
// with its own reason, and not reported on the Machine (the report would
// meet the same certificate).
func TestRefusalKinds(t *testing.T) {
	start := time.Now()
	notYet := &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/apis", Err: &tls.CertificateVerificationError{
		Err: x509.CertificateInvalidError{Reason: x509.Expired, Detail: "current time is before 2027-12-01"}}}
	for _, c := range []struct {
		name     string
		err      error
		machine  *v1alpha3.Machine
		reason   string
		noAnswer bool
		retried  bool
	}{
		{name: "fenced", machine: &v1alpha3.Machine{Spec: v1alpha3.MachineSpec{Allocation: &v1alpha3.AllocationRef{UID: "uid-1", Fenced: true}}},
			reason: v1alpha3.ReasonAllocationFenced},
		{name: "unreachable", err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED},
			reason: v1alpha3.ReasonClusterUnreachable, noAnswer: true, retried: true},
		{name: "clock far off", err: notYet, reason: ReasonClockSkew, noAnswer: true, retried: true},
		{name: "wrong CA", err: &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/apis", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}},
			reason: ReasonServerUntrusted},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := &fakeClock{t: start}
			api := &scriptedAPI{get: func(*rest.Config) (*v1alpha3.Machine, error) {
				clock.t = clock.t.Add(10 * time.Millisecond)
				return c.machine, c.err
			}}
			ch := &Check{Machine: "w1", AllocationUID: "uid-1", Budget: 10 * time.Second,
				Credentials: hostCredentials(t, start.Add(time.Hour)), Now: clock.now, Sleep: clock.sleep, API: api, Log: quiet}
			var r *Refusal
			if err := ch.Run(context.Background()); !errors.As(err, &r) || r.Reason != c.reason || r.NoAnswer != c.noAnswer {
				t.Fatalf("Run: %v (%+v), want reason %s, NoAnswer %v", err, r, c.reason, c.noAnswer)
			}
			if (api.gets > 1) != c.retried {
				t.Errorf("%d reads, retried want %v", api.gets, c.retried)
			}
			if c.reason == ReasonClockSkew && api.mutates != 0 {
				t.Errorf("a clock-skew refusal was reported on the Machine (%d writes)", api.mutates)
			}
		})
	}
}
