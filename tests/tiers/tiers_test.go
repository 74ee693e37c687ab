package tiers

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

func TestParseAcceptsTheTierNamesAndTheOldKubeSwitch(t *testing.T) {
	for _, tc := range []struct {
		required, kube string
		want           []string
	}{
		{"", "", nil},
		{"system,packages,kube", "", []string{"kube", "packages", "system"}},
		{" system , lint,", "", []string{"lint", "system"}},
		{"kubernetes", "", []string{"kube"}},
		{"", "1", []string{"kube"}},
		{"", "0", nil},
		{"fuzz", "1", []string{"fuzz", "kube"}},
	} {
		got, err := Parse(tc.required, tc.kube)
		if err != nil {
			t.Errorf("Parse(%q, %q): %v", tc.required, tc.kube, err)
			continue
		}
		if len(got) != len(tc.want) {
			t.Errorf("Parse(%q, %q) = %v, want %v", tc.required, tc.kube, got, tc.want)
		}
		for _, n := range tc.want {
			if !got[n] {
				t.Errorf("Parse(%q, %q) = %v, want %v", tc.required, tc.kube, got, tc.want)
			}
		}
	}
}

func TestParseRefusesAMisspeltTier(t *testing.T) {
	_, err := Parse("system,sytem", "")
	if err == nil || !strings.Contains(err.Error(), "unknown tier sytem") || !strings.Contains(err.Error(), EnvRequired) {
		t.Errorf("Parse(system,sytem): %v, want an error naming %s and the unknown tier", err, EnvRequired)
	}
	if _, err := Parse("", "yes"); err == nil {
		t.Errorf("Parse(%s=yes): no error", EnvKubeRequired)
	}
}

func TestSkipSkipsUnlessTheTierIsRequiredThenFails(t *testing.T) {
	for _, tc := range []struct {
		name, required, kube string
		wantFatal            bool
		wantIn               string
	}{
		{"not required", "packages,kube", "", false, "no rootfs here"},
		{"required", "packages,system", "", true, `the system tier is required (UNBOUNDED_TEST_REQUIRED="packages,system") but cannot run here: no rootfs here`},
		{"misspelt", "sytem", "", true, "unknown tier sytem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvRequired, tc.required)
			t.Setenv(EnvKubeRequired, tc.kube)
			rec := record(func(tb testing.TB) { Skip(tb, System, "no rootfs %s", "here") })
			if rec.fatal != tc.wantFatal || rec.skipped == tc.wantFatal || !strings.Contains(rec.msg, tc.wantIn) {
				t.Errorf("Skip: fatal=%v skipped=%v msg=%q; want fatal=%v with %q", rec.fatal, rec.skipped, rec.msg, tc.wantFatal, tc.wantIn)
			}
		})
	}
}

func TestTheOldKubeSwitchMakesKubeSkipsFail(t *testing.T) {
	t.Setenv(EnvRequired, "")
	t.Setenv(EnvKubeRequired, "1")
	if rec := record(func(tb testing.TB) { Skip(tb, Kube, "kubeenv: no test API server") }); !rec.fatal {
		t.Errorf("%s=1: kube skip was not a failure: %+v", EnvKubeRequired, rec)
	}
	if rec := record(func(tb testing.TB) { Skip(tb, System, "not root") }); !rec.skipped {
		t.Errorf("%s=1: system skip was not a skip: %+v", EnvKubeRequired, rec)
	}
}

// recorder records a skip or a fatal instead of ending the test; both end
// the calling goroutine as the testing package's do.
type recorder struct {
	testing.TB
	skipped, fatal bool
	msg            string
}

func record(f func(testing.TB)) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

func (r *recorder) Helper() {}

func (r *recorder) Skip(args ...any) {
	r.skipped, r.msg = true, strings.TrimSpace(fmt.Sprintln(args...))
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}
