package nodestack

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// The images of upstream's end-to-end specs (e2e.test --list-images) that
// build here from source, offline, by repository name: what each upstream
// Dockerfile (k8s.io/kubernetes/test/images/<name>) puts in, on top of
// Debian's busybox-static where upstream starts from a busybox or alpine
// base. They are loaded into the node under their upstream names (tagged
// images are pulled IfNotPresent, so nothing is pulled).
//
//	pause       build/pause/linux/pause.c, static (the stage's bin/pause)
//	busybox     busybox with every applet linked in /bin, /etc/passwd and
//	            /etc/group as the busybox image has them, CMD sh; /bin/sh
//	            is Debian's static bash (tests/conformance/build.sh says
//	            why: environment variables such as "data-1")
//	agnhost     the busybox base, /agnhost (and /agnhost-2), /uploads,
//	            /localhost.crt and .key (porter's), curl (curlShim), bash
//	            (Debian's static bash: upstream's image installs bash, which
//	            probe specs run), the image's own user and group;
//	            ENTRYPOINT /agnhost, CMD pause
//	nonroot     the busybox base, USER 1234
//	nonewprivs  the busybox base, /usr/local/bin/nnp setuid root, CMD nnp
//	glibc-dns-testing
//	            Debian bookworm: the test rootfs (the node image), CMD bash
var e2eImageNames = []string{"pause", "busybox", "agnhost", "nonroot", "nonewprivs", "glibc-dns-testing"}

// curlShim is the agnhost image's curl: upstream's image has alpine's curl,
// which the exec lifecycle hook specs run as `curl http://HOST:PORT/PATH`;
// busybox's wget does that GET (curl's options are ignored, URLs fetched
// in turn, the body printed, the exit status non-zero on failure).
const curlShim = `#!/bin/sh
# curl for the e2e agnhost image (tests/system/nodestack/e2eimages.go):
# GET each URL with busybox wget, body to stdout.
rc=0
for a in "$@"; do
	case $a in
	http://* | https://*) busybox wget -q -O - "$a" || rc=$? ;;
	esac
done
exit $rc
`

const busyboxPasswd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
`

const busyboxGroup = `root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
wheel:x:10:root
mail:x:8:
www-data:x:33:
operator:x:37:
users:x:100:
nogroup:x:65534:
`

// E2EImages builds, for every reference of refs in registry.k8s.io whose
// repository is one of e2eImageNames, its image; bin holds agnhost and nnp (tests/conformance/
// build.sh). It returns the images by reference and the references it
// cannot build.
func (s *Stage) E2EImages(t testing.TB, refs []string, bin string) (map[string]v1.Image, []string) {
	t.Helper()
	busybox := filepath.Join(s.Dir, "bin", "busybox")
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		t.Fatalf("nodestack: %s --list: %v", busybox, err)
	}
	read := func(p string) []byte {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	bb := read(busybox)
	bash := read(filepath.Join(bin, "bash-static"))
	base := func(passwd, group string, bashSh bool) []tarEntry {
		e := []tarEntry{
			{name: "bin", mode: 0o40755}, {name: "bin/busybox", mode: 0o755, data: bb},
			{name: "etc", mode: 0o40755},
			{name: "etc/passwd", mode: 0o644, data: []byte(busyboxPasswd + passwd)},
			{name: "etc/group", mode: 0o644, data: []byte(busyboxGroup + group)},
			{name: "root", mode: 0o40700}, {name: "home", mode: 0o40755},
			{name: "tmp", mode: 0o41777}, {name: "var", mode: 0o40755},
			{name: "usr", mode: 0o40755}, {name: "usr/local", mode: 0o40755}, {name: "usr/local/bin", mode: 0o40755},
		}
		for _, a := range strings.Fields(string(out)) {
			if a != "busybox" && !strings.Contains(a, "/") && !(a == "sh" && bashSh) {
				e = append(e, tarEntry{name: "bin/" + a, linkname: "busybox"})
			}
		}
		if bashSh {
			e = append(e, tarEntry{name: "bin/sh", mode: 0o755, data: bash})
		}
		return e
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	images := map[string]v1.Image{}
	var missing []string
	for _, ref := range refs {
		// Only the public registry's: the specs that name another
		// registry (gcr.io/k8s-authenticated-test's private agnhost,
		// invalid.registry.k8s.io) check that pulling from it fails or
		// needs credentials, which a loaded copy would defeat.
		if !strings.HasPrefix(ref, "registry.k8s.io/") {
			missing = append(missing, ref)
			continue
		}
		repo := ref
		if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
			repo = repo[:i]
		}
		switch path.Base(repo) {
		case "pause":
			images[ref] = s.PauseImage(t)
		case "busybox":
			images[ref] = image(t, memLayer(t, base("", "", true)), v1.Config{Cmd: []string{"sh"}, Env: env})
		case "agnhost":
			e := append(base("user-defined-in-image:x:1000:1000:Linux User,,,:/home/user-defined-in-image:/bin/sh\n",
				"user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n", false),
				tarEntry{name: "agnhost", mode: 0o755, data: read(filepath.Join(bin, "agnhost"))},
				tarEntry{name: "agnhost-2", linkname: "agnhost"},
				tarEntry{name: "uploads", mode: 0o40755},
				tarEntry{name: "bin/bash", mode: 0o755, data: bash},
				tarEntry{name: "usr/bin", mode: 0o40755},
				tarEntry{name: "usr/bin/curl", mode: 0o755, data: []byte(curlShim)},
				tarEntry{name: "localhost.crt", mode: 0o644, data: read(filepath.Join(bin, "localhost.crt"))},
				tarEntry{name: "localhost.key", mode: 0o644, data: read(filepath.Join(bin, "localhost.key"))},
				tarEntry{name: "home/user-defined-in-image", mode: 0o40755},
			)
			images[ref] = image(t, memLayer(t, e), v1.Config{Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: env})
		case "nonroot":
			images[ref] = image(t, memLayer(t, base("", "", false)), v1.Config{Cmd: []string{"sh"}, Env: env, User: "1234"})
		case "nonewprivs":
			e := append(base("", "", false), tarEntry{name: "usr/local/bin/nnp", mode: 0o4755, data: read(filepath.Join(bin, "nnp"))})
			images[ref] = image(t, memLayer(t, e), v1.Config{Cmd: []string{"nnp"}, Env: env})
		case "glibc-dns-testing":
			// Upstream's is debian:bookworm-slim with dnsutils and
			// coredns added; the specs that use it (pod hostname
			// override) run sh and hostname. The test rootfs is Debian
			// bookworm too (minbase: what -slim has).
			img, err := mutate.Config(s.NodeImage(t), v1.Config{Cmd: []string{"bash"}, Env: env})
			if err != nil {
				t.Fatal(err)
			}
			images[ref] = img
		default:
			missing = append(missing, ref)
		}
	}
	if len(images) == 0 {
		t.Fatalf("nodestack: none of %v is one of %v", refs, e2eImageNames)
	}
	return images, missing
}
