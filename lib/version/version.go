// Package version holds the agent's version, stamped at build time by the
// Makefile (-ldflags -X unbounded-cloud.io/agent/lib/version.Version=...).
package version

// Version is the agent version; "dev" in an unstamped build.
var Version = "dev"
