package exitcode

import (
	"errors"
	"fmt"
	"testing"

	"unbounded-cloud.io/agent/lib/state"
)

func TestForMapsEachErrorClassToItsUnitContractCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"nil is done", nil, 0},
		{"ownership defers", fmt.Errorf("bootstrap: %w", state.ErrOwned), 69},
		{"temporary retries", fmt.Errorf("get machine: %w: %w", ErrTemporary, errors.New("connection refused")), 75},
		{"refusal is final", fmt.Errorf("fence: %w", ErrRefused), 77},
		{"invalid config", fmt.Errorf("load: %w", ErrConfigInvalid), 78},
		{"anything else fails", errors.New("disk full"), 1},
		{"refusal wins over temporary", fmt.Errorf("%w after %w", ErrRefused, ErrTemporary), 77},
		{"ownership wins over everything but needs root", errors.Join(ErrTemporary, state.ErrOwned, ErrRefused, ErrConfigInvalid), 69},
		{"needs root", fmt.Errorf("read state: %w", ErrNeedsRoot), 4},
		{"needs root wins: nothing was decided", errors.Join(state.ErrOwned, ErrConfigInvalid, ErrNeedsRoot), 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := For(tc.err); got != tc.want {
				t.Errorf("For(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}
