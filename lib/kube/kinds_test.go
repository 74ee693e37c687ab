package kube

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/regfile/regfiletest"
)

// hangDetector bounds each read in the test below: it detects a read that
// blocks, not a slow one.
const hangDetector = 2 * time.Second

// TestCredentialFilesThatAreNotRegularFilesAreErrorsAtOnce: the fence and
// the daemon read the token, the CA and the stored certificate; a FIFO or
// /dev/zero in their place must be an error naming the file, not a hang.
func TestCredentialFilesThatAreNotRegularFilesAreErrorsAtOnce(t *testing.T) {
	makers := map[string]func(t testing.TB, f string){
		"oversized file": func(t testing.TB, f string) { regfiletest.Sparse(t, f, maxCredentialFileSize+1) },
	}
	for _, k := range regfiletest.Kinds {
		makers[k.String()] = func(t testing.TB, f string) { regfiletest.Make(t, f, k) }
	}
	within := func(t *testing.T, what string, f func() error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			return err
		case <-time.After(hangDetector):
			t.Fatalf("%s did not return within %v", what, hangDetector)
			return nil
		}
	}
	for name, mk := range makers {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := CertStore{Dir: dir}
			mk(t, s.Path())
			if err := within(t, "CertStore.Load", func() error { _, err := s.Load(); return err }); !errors.Is(err, ErrNoCertificate) || !strings.Contains(err.Error(), s.Path()) {
				t.Errorf("certificate: %v, want ErrNoCertificate naming %s", err, s.Path())
			}
			token := filepath.Join(dir, "bootstrap-token")
			mk(t, token)
			if err := within(t, "ReadToken", func() error { _, err := ReadToken(token); return err }); err == nil || !strings.Contains(err.Error(), token) {
				t.Errorf("token: %v, want an error naming %s", err, token)
			}
			ca := filepath.Join(dir, "ca.crt")
			mk(t, ca)
			c := Credentials{APIServer: "https://127.0.0.1:1", CAFile: ca, TokenFile: token, Certs: s}
			if err := within(t, "BootstrapConfig", func() error { _, err := c.BootstrapConfig(); return err }); err == nil || !strings.Contains(err.Error(), ca) {
				t.Errorf("CA: %v, want an error naming %s", err, ca)
			}
		})
	}
}
