package system_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// hostDevices are the devices of this machine an nspawn scenario hands its
// test host, so that the host's own discovery finds them and gives them to
// its node machine: /dev/kvm and /dev/fuse where this machine has them
// (nspawn gives a container /dev/net/tun itself), and a scratch loop
// device holding a marker, which a host's discovery never gives by itself
// (loop devices are skipped) and which the test's configuration allows by
// name.
type hostDevices struct {
	nspawnArgs []string
	// loop is the loop device, marker what its first bytes are.
	loop, marker string
	// have are the character devices the host is given, as discovery
	// should find them.
	have []string
}

// newHostDevices makes the loop device (detached at cleanup) and says
// which devices of this machine the host gets. A machine without /dev/kvm
// or loop devices skips the scenario's device part with a reason.
func newHostDevices(t *testing.T) *hostDevices {
	t.Helper()
	d := &hostDevices{have: []string{"/dev/net/tun"}}
	for _, p := range []string{"/dev/kvm", "/dev/fuse"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			d.nspawnArgs = append(d.nspawnArgs, "--bind="+p)
			d.have = append(d.have, p)
		}
	}
	b := make([]byte, 8)
	rand.Read(b)
	d.marker = "ubt-" + hex.EncodeToString(b)
	img := filepath.Join(t.TempDir(), "scratch.img")
	data := make([]byte, 1<<20)
	copy(data, d.marker)
	if err := os.WriteFile(img, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Skipf("skipped: this machine cannot attach a loop device for the device scenario: %v: %s", err, out)
	}
	d.loop = strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", d.loop).Run() })
	d.nspawnArgs = append(d.nspawnArgs, "--bind="+d.loop)
	return d
}

// config is the test host's [devices]: discovery on, the loop device
// allowed by name.
func (d *hostDevices) config() string {
	return "\n[devices]\nauto = true\nallow = [\"" + d.loop + "\"]\n"
}

// wantInNode checks what a node with these devices has: the machine's
// settings file binds each, `unbounded status` lists each, and a
// privileged pod on the node opens /dev/kvm and /dev/net/tun and reads the
// loop device's marker (the host's own disks are not there: the test host
// has none of this machine's).
func (d *hostDevices) wantInNode(t *testing.T, f *firstBoot) {
	t.Helper()
	settings, err := f.m.ReadFile("/etc/systemd/nspawn/kube1.nspawn")
	if err != nil {
		t.Fatal(err)
	}
	status, _ := f.m.Run("unbounded", "status")
	for _, p := range append(append([]string{}, d.have...), d.loop) {
		if !strings.Contains(string(settings), "\nBind="+p+"\n") {
			t.Errorf("kube1.nspawn does not bind %s:\n%s", p, settings)
		}
		if !strings.Contains(status, "device:      "+p+" ") {
			t.Errorf("unbounded status does not list %s:\n%s", p, status)
		}
	}
	if strings.Contains(string(settings), "Bind=/dev/vda") || strings.Contains(string(settings), "Bind=/dev/sda") {
		t.Errorf("a disk of this machine's is bound into the node:\n%s", settings)
	}

	ctx := context.Background()
	c := f.env.kube
	ns := newNamespace(t, c, "devices")
	// Each open fails the shell (a failed redirection of exec ends a
	// non-interactive sh); the marker goes to the termination message.
	script := "set -e; exec 3<>/dev/net/tun; "
	for _, p := range d.have {
		if p == "/dev/kvm" {
			script += "exec 4<>/dev/kvm; "
		}
	}
	script += "head -c " + strconv.Itoa(len(d.marker)) + " " + d.loop + " >/dev/termination-log"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "devices", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      f.name,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "open", Image: f.app, Command: []string{"sh", "-c", script},
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
			}},
		},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	waitUntil(t, 2*time.Minute, "the device pod finished", func(ctx context.Context) (bool, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, "devices", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	var term *corev1.ContainerStateTerminated
	if cs := got.Status.ContainerStatuses; len(cs) == 1 {
		term = cs[0].State.Terminated
	}
	if got.Status.Phase != corev1.PodSucceeded || term == nil || term.Message != d.marker {
		t.Errorf("the privileged pod on the node: phase %s, terminated %+v; want Succeeded, having opened %v and read %q from %s",
			got.Status.Phase, term, d.have, d.marker, d.loop)
	}
}
