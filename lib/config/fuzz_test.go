package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
)

// FuzzLoad feeds arbitrary bytes as agent.toml (and the same bytes as a
// drop-in) to Load over a valid host. Seeds are in testdata/fuzz/FuzzLoad.
// Whatever the input: no panic, no hang, and every error is a config error
// that names a file.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(validConfig), false)
	f.Add([]byte("machine = \"x\"\n[cluster]\napi-server = 'https://a'\n"), true)
	f.Add([]byte("a.b.\"c\".'d' = { e = [1, { f = 2 }], \"g\" = \"\"\"\nx\n\"\"\" }\n[[t]]\n"), false)
	root := f.TempDir()
	p := hostpaths.New(root)
	for name, content := range map[string]string{
		"/etc/unbounded/ca.crt":          string(caPEM),
		"/etc/unbounded/bootstrap-token": testToken,
	} {
		os.MkdirAll(filepath.Dir(p.Join(name)), 0o755)
		if err := os.WriteFile(p.Join(name), []byte(content), 0o600); err != nil {
			f.Fatal(err)
		}
	}
	// One directory per worker process, reused: executions within a worker
	// are sequential, and a fresh t.TempDir per input costs more than the
	// load itself.
	dir := f.TempDir()
	file := filepath.Join(dir, "agent.toml")
	f.Fuzz(func(t *testing.T, data []byte, asDropin bool) {
		if err := os.RemoveAll(file + ".d"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(validConfig), 0o644); err != nil {
			t.Fatal(err)
		}
		if asDropin {
			os.Mkdir(file+".d", 0o755)
			file2 := filepath.Join(file+".d", "50-fuzz.toml")
			if err := os.WriteFile(file2, data, 0o644); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadFile(p, file)
		if err == nil {
			if cfg == nil || cfg.Machine == "" {
				t.Fatalf("accepted without a machine: %+v", cfg)
			}
			return
		}
		if cfg != nil {
			t.Errorf("both a config and an error")
		}
		if !errors.Is(err, exitcode.ErrConfigInvalid) {
			t.Errorf("error is not a config error: %T %v", err, err)
		}
		es := AsErrors(err)
		if len(es) == 0 {
			t.Fatalf("error holds no *config.Error: %T %v", err, err)
		}
		for _, e := range es {
			if e.File == "" || !strings.HasPrefix(e.File, dir) && !strings.HasPrefix(e.File, root) {
				t.Errorf("error names no file of this load: %q", e.Error())
			}
			if e.Line < 0 {
				t.Errorf("negative line: %v", e)
			}
		}
		if strings.Contains(err.Error(), testToken) {
			t.Errorf("token leaked: %v", err)
		}
	})
}
