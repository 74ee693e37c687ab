package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// unitScript answers `systemctl show` from a list of states of the repave
// unit, one per call after the first (the other units are idle), and
// keeps a clock that each call moves by one second.
type unitScript struct {
	states []string // "ActiveState|StatusText|Result|ExecMainStatus"
	calls  int
	clock  time.Time
}

func (s *unitScript) run(argv, _ []string, _ io.Reader, stdout, _ io.Writer) (int, error) {
	if argv[0] != "systemctl" || argv[1] != "show" {
		return 1, fmt.Errorf("unexpected %v", argv)
	}
	st := s.states[min(s.calls, len(s.states)-1)]
	s.calls++
	s.clock = s.clock.Add(time.Second)
	f := strings.Split(st, "|")
	for _, u := range argv[4:] {
		if u != "unbounded-repave.service" {
			fmt.Fprintf(stdout, "Id=%s\nActiveState=inactive\nStatusText=\nResult=success\nExecMainStatus=0\nInvocationID=\n\n", u)
			continue
		}
		fmt.Fprintf(stdout, "Id=%s\nActiveState=%s\nStatusText=%s\nResult=%s\nExecMainStatus=%s\nInvocationID=abc\n\n", u, f[0], f[1], f[2], f[3])
	}
	return 0, nil
}

// status --follow shows each step once, with its time, and ends with the
// run; a failed run is the command's failure with its exit status.
func TestFollowShowsEachStepOnceUntilTheRunEnds(t *testing.T) {
	s := &unitScript{states: []string{
		"activating|step plan: the desired config|success|0",
		"activating|step plan: the desired config|success|0",
		"activating|step prepare: slot kube2|success|0",
		"activating|step drain: node n|success|0",
		"activating|step drain: node n|success|0",
		"inactive||success|0",
	}, clock: time.Unix(0, 0)}
	env := &Env{RunTool: s.run}
	var out bytes.Buffer
	if err := env.follow(&out, time.Second, time.Millisecond, func() time.Time { return s.clock }); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, step := range []string{"step plan", "step prepare", "step drain"} {
		if strings.Count(got, step) != 1 {
			t.Errorf("%q shown %d times, want once:\n%s", step, strings.Count(got, step), got)
		}
	}
	if !strings.Contains(got, "following unbounded-repave.service") || !strings.Contains(got, "unbounded-repave.service finished after") ||
		!strings.Contains(got, "step prepare: slot kube2  (2s)") {
		t.Errorf("output:\n%s", got)
	}

	s = &unitScript{states: []string{"activating|step drain: node n|success|0", "failed||exit-code|1"}, clock: time.Unix(0, 0)}
	env = &Env{RunTool: s.run}
	out.Reset()
	err := env.follow(&out, time.Second, time.Millisecond, func() time.Time { return s.clock })
	var child childExit
	if err == nil || !errors.As(err, &child) || child != 1 || !strings.Contains(out.String(), "failed after") {
		t.Errorf("a failed run: %v\n%s", err, out.String())
	}

	// Nothing runs, nor starts within the wait.
	s = &unitScript{states: []string{"inactive||success|0"}, clock: time.Unix(0, 0)}
	env = &Env{RunTool: s.run}
	out.Reset()
	if err := env.follow(&out, 3*time.Second, time.Millisecond, func() time.Time { return s.clock }); err != nil || !strings.Contains(out.String(), "no operation runs") {
		t.Errorf("nothing runs: %v\n%s", err, out.String())
	}
}
