package kube

import (
	"math"
	"testing"
	"time"
)

func TestExpirationSecondsClampsInsteadOfWrapping(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int32
	}{
		{time.Hour, 3600},
		{90*time.Minute + 999*time.Millisecond, 5400},
		{math.MaxInt32 * time.Second, math.MaxInt32},
		// 100 years: int32(d/time.Second) wraps to a negative number.
		{100 * 365 * 24 * time.Hour, math.MaxInt32},
		{math.MaxInt64, math.MaxInt32},
	} {
		if got := expirationSeconds(tc.d); got != tc.want {
			t.Errorf("expirationSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}
