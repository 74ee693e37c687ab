package harness

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupParent groups every test machine under one directory per hierarchy,
// so that leftovers of a killed test run are easy to find and remove.
const cgroupParent = "unbounded-tests"

// cgroupHierarchies returns the mount points of every cgroup hierarchy
// (v1 controllers, the name=systemd hierarchy and the unified cgroup2) under
// /sys/fs/cgroup.
//
// Why every hierarchy: without a host systemd, every nspawn process starts in
// the host's cgroup (here /payload) in each hierarchy, and two containers
// booted there clash on their init.scope/system.slice (TESTING.md). Giving
// each its own cgroup in every hierarchy also lets later scenarios (kubelet
// inside the container) find their controllers, and lets teardown find every
// process that belongs to a machine.
func cgroupHierarchies() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SRC SUPER
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		fstype := fields[sep+1]
		mnt := fields[4]
		if (fstype == "cgroup" || fstype == "cgroup2") && strings.HasPrefix(mnt, "/sys/fs/cgroup") {
			out = append(out, mnt)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no cgroup hierarchy mounted under /sys/fs/cgroup")
	}
	return out, sc.Err()
}

// createCgroups makes <hierarchy>/unbounded-tests/<name> in every hierarchy
// and returns the cgroup.procs files the nspawn process must join, and the
// directories to remove afterwards.
func createCgroups(name string) (procs, dirs []string, err error) {
	hs, err := cgroupHierarchies()
	if err != nil {
		return nil, nil, err
	}
	for _, h := range hs {
		parent := filepath.Join(h, cgroupParent)
		dir := filepath.Join(parent, name)
		for _, d := range []string{parent, dir} {
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return nil, dirs, fmt.Errorf("create cgroup %s: %w", d, err)
			}
			// A v1 cpuset cgroup starts with no CPUs and no memory
			// nodes; a process cannot join it until they are copied
			// from the parent.
			if err := inheritCpuset(d); err != nil {
				return nil, dirs, err
			}
		}
		dirs = append(dirs, dir)
		procs = append(procs, filepath.Join(dir, "cgroup.procs"))
	}
	return procs, dirs, nil
}

func inheritCpuset(dir string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		own := filepath.Join(dir, f)
		cur, err := os.ReadFile(own)
		if err != nil {
			continue // not a v1 cpuset hierarchy
		}
		if strings.TrimSpace(string(cur)) != "" {
			continue
		}
		val, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(own, val, 0o644); err != nil {
			return fmt.Errorf("initialise %s: %w", own, err)
		}
	}
	return nil
}

// cgroupCPU is the CPU time used by the processes of the cgroups dirs,
// from the cpuacct hierarchy's (zero where there is none).
func cgroupCPU(dirs []string) time.Duration {
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(d, "cpuacct.usage"))
		if err != nil {
			continue
		}
		if ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64); err == nil {
			return time.Duration(ns)
		}
	}
	return 0
}

// removeCgroups kills whatever is still in the machine's cgroups (nothing,
// after a clean poweroff) and removes them depth-first: the container's
// systemd creates its own sub-cgroups (init.scope, system.slice, ...) and a
// cgroup directory can only be removed once it has no children.
func removeCgroups(dirs []string) error {
	var errs []error
	for _, dir := range dirs {
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := removeTree(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	killProcs(filepath.Join(dir, "cgroup.procs"))
	return syscall.Rmdir(dir)
}

func killProcs(procsFile string) {
	data, err := os.ReadFile(procsFile)
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
