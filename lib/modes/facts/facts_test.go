package facts

import (
	"slices"
	"testing"
)

func TestEachModesUnitsAreItsOwnAndAnUnknownModeHasNone(t *testing.T) {
	for _, c := range []struct {
		mode, kubeletHost       string
		supervising             []string
		kubeletIn, containerdIn string
		kubelet, containerd     string
	}{
		{"nspawn", "systemd-nspawn@kube2.service", []string{"systemd-nspawn@kube2.service"}, "kube2", "kube2", "kubelet.service", "containerd.service"},
		{"container", "unbounded-container@kube2.service", []string{"unbounded-container@kube2.service"}, "kube2", "kube2", "kubelet.service", "containerd.service"},
		{"none", "unbounded-kubelet.service", []string{"unbounded-containerd.service", "unbounded-kubelet.service"}, "", "", "unbounded-kubelet.service", "unbounded-containerd.service"},
	} {
		if got := Supervising(c.mode, "kube2"); !slices.Equal(got, c.supervising) {
			t.Errorf("Supervising(%s) = %q, want %q", c.mode, got, c.supervising)
		}
		if got := KubeletHost(c.mode, "kube2"); got != c.kubeletHost {
			t.Errorf("KubeletHost(%s) = %q, want %q", c.mode, got, c.kubeletHost)
		}
		if m, u, ok := NodeUnit(c.mode, "kube2", "kubelet"); !ok || m != c.kubeletIn || u != c.kubelet {
			t.Errorf("NodeUnit(%s, kubelet) = %q %q %v", c.mode, m, u, ok)
		}
		if m, u, ok := NodeUnit(c.mode, "kube2", "containerd"); !ok || m != c.containerdIn || u != c.containerd {
			t.Errorf("NodeUnit(%s, containerd) = %q %q %v", c.mode, m, u, ok)
		}
		if _, _, ok := NodeUnit(c.mode, "kube2", "etcd"); ok {
			t.Errorf("NodeUnit(%s, etcd) is known", c.mode)
		}
	}
	if Supervising("vm", "kube1") != nil || KubeletHost("vm", "kube1") != "" || Valid("vm") || FromNodeImage("vm") {
		t.Error("an unknown mode has facts")
	}
	if _, _, ok := NodeUnit("vm", "kube1", "kubelet"); ok {
		t.Error("NodeUnit of an unknown mode")
	}
}

// Every change pair names two modes of the table, never the same one,
// with a method this build knows.
func TestChangesAreBetweenTwoModesOfTheTable(t *testing.T) {
	for p, m := range Changes {
		if !Valid(p[0]) || !Valid(p[1]) || p[0] == p[1] || (m != MethodInPlace && m != MethodReprovision) {
			t.Errorf("change %v: %s", p, m)
		}
	}
	if !slices.Equal(Names(), []string{"nspawn", "container", "none"}) {
		t.Errorf("Names() = %q", Names())
	}
}
