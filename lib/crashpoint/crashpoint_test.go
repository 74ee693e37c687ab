package crashpoint

import "testing"

func TestViaCallsTheHookInsteadOfHit(t *testing.T) {
	t.Setenv(Env, "op/point")
	var got []string
	Via(func(name string) { got = append(got, name) }, "op/point") // Hit would kill the test
	if len(got) != 1 || got[0] != "op/point" {
		t.Errorf("hook got %q, want [op/point]", got)
	}
	Via(nil, "op/other") // not the named point: Hit returns
}
