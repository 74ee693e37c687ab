package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
)

// Which credential the daemon uses, and why:
//
//   - the stored client certificate while it is unexpired. It is the
//     daemon's own identity (unbounded-agent:<machine>), which may read
//     Machines, Nodes and operations and write the status of its own (the
//     admission policies of lib/api/manifests find the machine in the name); it does not depend on the bootstrap token,
//     which the cluster revokes when it fences the allocation;
//   - else the bootstrap token, so that a host whose certificate has not
//     been issued yet (the CSR waits for the cluster-side approver) still
//     carries out operations. Meanwhile the daemon requests a certificate
//     in the background and switches to it once issued.
//
// While on the certificate the daemon renews it at 80 % of its life
// (kube.RenewAt) with the certificate itself, then switches. A switch
// restarts the watches in-process (one list each), never the operations:
// a running job is resumed as after a restart.

var errCredentialsRenewed = errors.New("client certificate renewed")

type credentials struct {
	machine string
	kind    string // "certificate" or "bootstrap token"
	rest    *rest.Config
	renew   *renewal
	// pending is, on the bootstrap token, why no certificate is used
	// (none issued yet, expired, another machine's).
	pending string
}

// tokenOnly reports whether the daemon speaks with the bootstrap token:
// the admission policies let it write only the bootstrap's part of the
// Machine's status (lib/api/manifests, [bootstrap-status]).
func (c *credentials) tokenOnly() bool { return c.kind == "bootstrap token" }

// renewal obtains the next certificate at a point in time.
type renewal struct {
	at      time.Time
	manager kube.CertManager
}

func loadCredentials(p hostpaths.Paths, now time.Time) (*credentials, error) {
	cfg, err := config.Load(p)
	if err != nil {
		return nil, err
	}
	creds := kube.CredentialsFor(cfg, p.PKIDir())
	mgr := kube.CertManager{Store: creds.Certs, Machine: cfg.Machine}
	rc, cert, certErr := creds.CertConfig(now)
	if certErr == nil {
		return &credentials{machine: cfg.Machine, kind: "certificate", rest: rc,
			renew: &renewal{at: kube.RenewAt(cert), manager: mgr}}, nil
	}
	rc, err = creds.BootstrapConfig()
	if err != nil {
		return nil, fmt.Errorf("no usable client certificate (%v) and no bootstrap token: %w", certErr, err)
	}
	return &credentials{machine: cfg.Machine, kind: "bootstrap token", rest: rc,
		renew: &renewal{at: now, manager: mgr}, pending: certErr.Error()}, nil
}

// run waits until the renewal point, obtains a certificate with cfg, and
// calls done once it is stored. Failures are retried every 5 minutes:
// the current credential keeps working meanwhile (a certificate until it
// expires, after which the next start falls back to the token). It runs
// only while the Machine lives (see followMachine).
func (r *renewal) run(ctx context.Context, d *daemon, cfg *rest.Config, done func()) {
	if wait := r.at.Sub(d.host.now()); wait > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
	r.manager.Log = d.log
	for {
		_, err := r.manager.EnsureConfig(ctx, cfg)
		if err == nil {
			done()
			return
		}
		if ctx.Err() != nil {
			return
		}
		d.log.Warn("cannot obtain a client certificate; retrying in 5m", "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Minute):
		}
	}
}
