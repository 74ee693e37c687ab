package nspawn

import (
	"fmt"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/nodestack"
	"unbounded-cloud.io/agent/lib/modes/softreboot"
)

// DropInName is the drop-in Prepare writes for systemd-nspawn@<slot>.service.
const DropInName = "50-unbounded-node.conf"

// dropIn is /etc/systemd/system/systemd-nspawn@<slot>.service.d/DropInName.
// grace is the node's graceful shutdown period (the kubelet's
// shutdownGracePeriod), which the stop's bound covers.
func dropIn(slot string, cg nodestack.Cgroup, grace time.Duration) string {
	unified, why := "0", "the host binds the kubelet's controllers (cpu, memory, pids) to cgroup v1, so\n# a unified machine would have no working controllers: legacy"
	if cg == nodestack.Unified {
		unified, why = "1", "the host's cgroup2 hierarchy carries the kubelet's controllers: unified"
	}
	return fmt.Sprintf(`# Written by unbounded-agent for node slot %[1]s; regenerated at every
# prepare of the slot, removed with it.
[Unit]
# The stop below reaches the machine through machined's record of it: at
# the host's shutdown the machine stops before machined does.
After=systemd-machined.service

[Service]
# /proc/sys and /sys writable in the machine: kubelet sets sysctls
# (vm.overcommit_memory, kernel.panic, ...) at start and refuses to run
# when it cannot.
Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=1
# The machine's cgroup hierarchy, chosen at prepare from this host's:
# %[2]s.
Environment=SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=%[3]s
# No device restriction on the machine's cgroup: the stock unit allows only
# the devices nspawn itself needs (DevicePolicy=closed), which takes
# /dev/kmsg from kubelet and makes runc's own per-container device rules
# fail. runc confines every container's devices itself; the node stack
# needs the host's (GPUs, storage) to hand them to pods.
DevicePolicy=auto
DeviceAllow=
# Before every start of the machine (the host's boot, a restart, a
# repave's switch) the host's devices are found again under the slot's
# rules and the settings file rewritten when they changed: devices come
# and go. "-": a failure leaves the node the devices it had.
ExecStartPre=-%[4]s --devices-of=%[1]s
# A node runs many more tasks than the stock unit's 16384 (every pod's
# processes and threads are the machine's); kubelet limits pods itself
# (podPidsLimit).
TasksMax=infinity
# The stop is the machine's poweroff through its own logind (graceful node
# shutdown: the kubelet ends the pods in order, each within its grace
# period, and says so on the Node and the pods), waited for at most the
# kubelet's shutdownGracePeriod + 15 s; then (or at once, where that
# fails) the stock stop: SIGTERM to nspawn, the machine's poweroff by
# SIGRTMIN+4, which logind never sees. "-": the stop goes on either way.
ExecStop=-%[4]s --poweroff-of=%[1]s
# Covers the wait above and then the machine's own stop (its units bounded
# to 10 s each); never below the host's usual 90 s.
TimeoutStopSec=%[5]s
`, slot, why, unified, RestartBinary, StopTimeout(grace))
}

// StopTimeout is a node machine's TimeoutStopSec for a graceful shutdown
// period grace: the graceful poweroff's bound
// (grace + softreboot.PowerOffMargin) and 15 s more for the stock stop
// after it, at least 90 s, in whole seconds.
func StopTimeout(grace time.Duration) string {
	d := max(grace+softreboot.PowerOffMargin+15*time.Second, 90*time.Second)
	return fmt.Sprintf("%ds", int(d.Round(time.Second)/time.Second))
}

// RestartBinary is unbounded-restart, which also finds a slot's devices
// again (--devices-of, machinefile.Refresh) before its machine starts.
const RestartBinary = hostpaths.LibexecDirHost + "/restart"
