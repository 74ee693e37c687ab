package kube

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// retryBackoff spaces the tries of a request that got no answer (see
// NoAnswer: refused or cut connections, 5xx, timeouts, a 429 of the API
// server's flow control): 0.5 s doubling to 5 s, so that a restart of the
// API server of a few seconds costs a few seconds, and a long outage one
// request every 5 s. Steps only limits the doubling (the cap ends it
// sooner); the caller's bound ends the tries.
var retryBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Cap: 5 * time.Second, Steps: 10}

// Retry is the one rule for the cluster requests of the host's operations
// (the drain's, the Machine's status, Events): call runs until it
// succeeds, fails with an error retriable does not accept, or until
// passes (or ctx ends); it returns call's last error. Each try gets ctx,
// not until: a request begun before until may finish after it.
func Retry(ctx context.Context, until time.Time, log *slog.Logger, what string, retriable func(error) bool, call func(context.Context) error) error {
	bounded, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	start := time.Now()
	tries := 0
	var last error
	delay := retryBackoff.DelayFunc()
	_ = delay.Until(bounded, true, true, func(context.Context) (bool, error) {
		tries++
		err := call(ctx)
		if err != nil && ctx.Err() != nil && last != nil {
			// The caller's context cut this try short: the answer
			// before says more than "context deadline exceeded".
			return true, nil
		}
		last = err
		if err == nil || !retriable(err) {
			return true, nil
		}
		if log != nil {
			log.Info("no answer from the API server; trying again", "request", what, "try", tries, "error", err.Error())
		}
		return false, nil
	})
	if last != nil && retriable(last) && tries > 1 {
		return fmt.Errorf("%w (%d tries in %s)", last, tries, time.Since(start).Round(100*time.Millisecond))
	}
	return last
}

// until is the bound of a request's retries: ctx's deadline, else
// DefaultRetryFor from now.
func until(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(DefaultRetryFor)
}
