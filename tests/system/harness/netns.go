package harness

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// A machine with Options.Network runs in a network namespace the harness
// makes afresh for each boot, as a host's network is fresh at every boot:
// what the machine's last boot left in it (links, routes, iptables rules,
// sockets) is gone when the machine starts again. The harness holds the
// namespace on a file in the machine's directory, so that the test can
// open listeners on the machine's own loopback (ListenIn) before PID 1
// starts, which stand for services a host reaches on its loopback from
// the first moment of its boot.

// newNetns makes a network namespace with its loopback up and binds it on
// the file path (created): the file holds the namespace until
// releaseNetns.
func newNetns(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, now in the new namespace, ends
		// with this goroutine and serves no other.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare the network namespace: %w", err)
			return
		}
		if err := loopbackUp(); err != nil {
			errc <- err
			return
		}
		self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(self, path, "", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind %s on %s: %w", self, path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// loopbackUp sets lo up in the calling thread's network namespace (a new
// namespace's lo is down, without 127.0.0.1, until then).
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_UP | unix.IFF_LOOPBACK | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

// releaseNetns drops the file's hold on the namespace; the kernel frees it
// (and what the machine left in it) once nothing else refers to it.
func releaseNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// ListenIn opens a TCP listener on each of addrs ("127.0.0.1:PORT") in the
// network namespace held by the file netns (what Options.Network is given).
// Accepting and serving on them works from any goroutine.
func ListenIn(netns string, addrs ...string) ([]net.Listener, error) {
	type result struct {
		lns []net.Listener
		err error
	}
	res := make(chan result, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, in the
		// machine's namespace.
		runtime.LockOSThread()
		fd, err := unix.Open(netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			res <- result{err: err}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			res <- result{err: fmt.Errorf("enter %s: %w", netns, err)}
			return
		}
		var lns []net.Listener
		for _, a := range addrs {
			ln, err := net.Listen("tcp", a)
			if err != nil {
				for _, l := range lns {
					l.Close()
				}
				res <- result{err: fmt.Errorf("listen on %s in %s: %w", a, filepath.Base(netns), err)}
				return
			}
			lns = append(lns, ln)
		}
		res <- result{lns: lns}
	}()
	r := <-res
	return r.lns, r.err
}
