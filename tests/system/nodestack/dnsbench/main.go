// Command dnsbench times DNS lookups from where it runs (a pod of the
// node-local DNS cache's benchmark, tests/system): -n lookups of one
// name (the second and later answered from a cache, if there is one) and
// -n lookups of names never asked before (-uncached with %d replaced by
// -from, -from+1, ...: each one travels to the server that answers for
// them), each an A query over UDP to -server, one at a time. A lookup
// that gets no answer is counted as failed, not timed. It prints one line
// per set:
//
//	dnsbench: <label> n=<n> failed=<k> p50=<ms> p99=<ms> max=<ms>
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"
)

func main() {
	server := flag.String("server", "", "the DNS server, host:port")
	label := flag.String("label", "", "a label for the output lines")
	name := flag.String("name", "", "the name looked up again and again (answered)")
	uncached := flag.String("uncached", "", "the names never asked before, with %d for a number")
	from := flag.Int("from", 0, "the first number of the uncached names")
	n := flag.Int("n", 1000, "lookups per set (at most 100000)")
	flag.Parse()
	if *server == "" || *name == "" || !strings.Contains(*uncached, "%d") || *n < 1 || *n > 100000 {
		flag.Usage()
		os.Exit(2)
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "udp", *server)
	}}
	run := func(set string, nameOf func(i int) string) {
		var took []time.Duration
		failed := 0
		for i := range *n {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			begin := time.Now()
			_, err := r.LookupIP(ctx, "ip4", nameOf(i))
			cancel()
			if err != nil {
				failed++
				continue
			}
			took = append(took, time.Since(begin))
		}
		slices.Sort(took)
		q := func(p float64) float64 {
			if len(took) == 0 {
				return 0
			}
			return float64(took[min(len(took)-1, int(p*float64(len(took))))].Microseconds()) / 1000
		}
		fmt.Printf("dnsbench: %s %s n=%d failed=%d p50=%.3f p99=%.3f max=%.3f\n", *label, set, *n, failed, q(0.50), q(0.99), q(1))
	}
	run("cached", func(int) string { return *name + "." })
	run("uncached", func(i int) string { return fmt.Sprintf(*uncached, *from+i) + "." })
}
