package docs

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/cli"
	"unbounded-cloud.io/agent/lib/fleet"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kubectlplugin"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// Every command the README shows is checked against the code
// (tests/README.md, "The README's commands", states the convention): a
// command is a line of a fenced ```sh block; every other block names its
// language, and an indented code block is refused, so no command escapes.

// repo is the repository's root, seen from this package's directory.
const repo = "../.."

// documents are the files whose commands are checked.
var documents = []string{"README.md", "tests/README.md"}

// languages are the fence languages a document may use, and whether the
// block holds commands.
var languages = map[string]bool{"sh": true, "toml": false, "text": false}

// byName are the commands accepted by their name alone, and why their
// arguments are not checked. A command that is neither here nor one the
// checker reads fails: add a check, or add it here with the reason.
var byName = map[string]string{
	"apt":         "package manager: installs the package file it is given",
	"apt-get":     "package manager: installs the package file it is given",
	"dpkg":        "package manager: installs the package file it is given",
	"rpm":         "package manager: installs the package file it is given",
	"dnf":         "package manager: installs the package file it is given",
	"install":     "coreutils; a path under the agent's directories is checked",
	"cp":          "coreutils; a path under the agent's directories is checked",
	"mkdir":       "coreutils; a path under the agent's directories is checked",
	"reboot":      "systemd's: reboots the host",
	"debootstrap": "Debian's: makes an OS tree for an image (an image builder's first step)",
	"chroot":      "coreutils: runs the package manager inside an image's root",
	"$EDITOR":     "the reader's editor; a path under the agent's directories is checked",
	"skopeo":      "containers' image copier: copies the image archive `make images` wrote to the operator's registry",
}

// kubectlVerbs are kubectl's own subcommands a document may show,
// accepted by name (they are kubectl's, not this project's).
var kubectlVerbs = map[string]string{
	"apply": "kubectl's own: applies what it is given",
	"get":   "kubectl's own: reads the cluster",
	"patch": "kubectl's own: changes an object's fields (a Machine's spec)",
}

// systemctlVerbs are the systemctl verbs a document may show; those in
// the map with true take units.
var systemctlVerbs = map[string]bool{
	"start": true, "stop": true, "restart": true, "status": true, "show": true, "cat": true,
	"is-active": true, "is-failed": true, "is-enabled": true, "enable": true, "disable": true,
	"mask": true, "unmask": true, "reset-failed": true, "kill": true,
	"daemon-reload": false, "list-units": false, "list-timers": false,
}

// roots are the agent's host directories: a path under one of them in a
// command must be one the code names.
var roots = []string{path.Dir(hostpaths.ConfigFileHost), hostpaths.HostRootHost, hostpaths.LibexecDirHost}

// shown is one command line of a document.
type shown struct {
	file string
	line int
	text string
}

func (s shown) String() string { return fmt.Sprintf("%s:%d: %s", s.file, s.line, s.text) }

var fence = regexp.MustCompile("^ {0,3}(```+|~~~+)[ \t]*([^ \t`]*)")

// extract returns the command lines of a document's sh blocks (a line
// ending in \ joined with the next; blank lines and comment lines left
// out), and what is wrong with its code blocks.
func extract(file, doc string) (cmds []shown, problems []string) {
	var (
		open     string // the open fence's marker, "" outside a block
		commands bool   // the open block holds commands
		pending  *shown // a line continued with \
		prev     = ""
	)
	for i, line := range strings.Split(doc, "\n") {
		n := i + 1
		if open == "" {
			if m := fence.FindStringSubmatch(line); m != nil {
				lang := m[2]
				is, ok := languages[lang]
				switch {
				case lang == "":
					problems = append(problems, fmt.Sprintf("%s:%d: a fence without a language: sh for commands, text for output, toml", file, n))
				case !ok:
					problems = append(problems, fmt.Sprintf("%s:%d: fence language %q: use sh for commands (checked), text or toml", file, n, lang))
				}
				open, commands = m[1], is
			} else if strings.TrimSpace(line) != "" && strings.TrimSpace(prev) == "" &&
				(strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t")) {
				problems = append(problems, fmt.Sprintf("%s:%d: an indented code block: fence it with its language (sh for commands)", file, n))
			}
			prev = line
			continue
		}
		if t := strings.TrimSpace(line); strings.HasPrefix(t, open[:1]) && strings.Trim(t, open[:1]) == "" && len(t) >= len(open) {
			if pending != nil {
				problems = append(problems, fmt.Sprintf("%s:%d: the block ends in a continued line", file, pending.line))
				pending = nil
			}
			open, prev = "", ""
			continue
		}
		if !commands {
			continue
		}
		text := strings.TrimSpace(line)
		if pending != nil {
			pending.text += " " + text
		} else {
			if text == "" || strings.HasPrefix(text, "#") {
				continue
			}
			pending = &shown{file: file, line: n, text: text}
		}
		if strings.HasSuffix(pending.text, `\`) {
			pending.text = strings.TrimSpace(strings.TrimSuffix(pending.text, `\`))
			continue
		}
		cmds = append(cmds, *pending)
		pending = nil
	}
	if open != "" {
		problems = append(problems, fmt.Sprintf("%s: a code block that never ends", file))
	}
	return cmds, problems
}

// checker knows what the code defines: units, make targets, man pages
// and host paths.
type checker struct {
	units    []string        // the files of units/
	targets  map[string]bool // the Makefile's
	manPages map[string]bool // NAME and NAME.SECTION the packages install
	paths    map[string]bool // host paths the code names
	dropDirs []string        // directories the operator drops files into
}

func newChecker(t *testing.T) *checker {
	t.Helper()
	c := &checker{targets: map[string]bool{}, manPages: map[string]bool{}, paths: map[string]bool{}}

	entries, err := os.ReadDir(filepath.Join(repo, "units"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch path.Ext(e.Name()) {
		case ".service", ".target", ".timer", ".path", ".socket":
			c.units = append(c.units, e.Name())
		}
	}
	for _, slot := range []string{"kube1", "kube2"} {
		c.units = append(c.units, facts.Supervising("nspawn", slot)...)
	}

	mk := read(t, "Makefile")
	target := regexp.MustCompile(`(?m)^([A-Za-z0-9_./%-][A-Za-z0-9_./% -]*):([^=]|$)`)
	for _, m := range target.FindAllStringSubmatch(mk, -1) {
		for _, name := range strings.Fields(m[1]) {
			c.targets[name] = true
		}
	}

	nfpm := read(t, "deb/nfpm.yaml")
	for _, m := range regexp.MustCompile(`(?m)^\s*-?\s*dst:\s*(\S+)`).FindAllStringSubmatch(nfpm, -1) {
		c.paths[m[1]] = true
		if mp := regexp.MustCompile(`^/usr/share/man/man(\d)/(.+)\.(\d)\.gz$`).FindStringSubmatch(m[1]); mp != nil {
			c.manPages[mp[2]], c.manPages[mp[2]+"."+mp[1]] = true, true
		}
	}
	concerns := regexp.MustCompile(`(?m)^CONCERNS="([^"]*)"`).FindStringSubmatch(read(t, "deb/build-packages.sh"))
	if concerns == nil {
		t.Fatal(`deb/build-packages.sh has no CONCERNS="..." line`)
	}
	p := hostpaths.New("")
	for _, name := range append(strings.Fields(concerns[1]), "unbounded-agent") {
		c.paths[p.Libexec(name)] = true
	}
	for _, f := range []string{
		hostpaths.ConfigFileHost, hostpaths.ConfigDropinDirHost, hostpaths.HostRootHost, hostpaths.LibexecDirHost,
		hostpaths.VersionsDirHost, hostpaths.VersionsCurrentHost, hostpaths.LegacyStateDirHost,
		fleet.HostConfig, fleet.HostCA, fleet.HostToken,
		p.Ownership(), p.JournalDir(), p.OwedDir(), p.UpgradeDir(), p.UpgradeStaged(), p.UpgradeFailed(),
		p.PKIDir(), p.OfflineDir(), p.ArtifactsDir(), p.HostPrepRecord(), p.Adopted(),
	} {
		c.paths[f] = true
	}
	for _, slot := range []string{"kube1", "kube2"} {
		c.paths[p.AppliedConfig(slot)], c.paths[hostpaths.Checksum(p.AppliedConfig(slot))], c.paths[p.SlotDir(slot)] = true, true, true
	}
	c.dropDirs = []string{hostpaths.ConfigDropinDirHost, p.UpgradeStaged(), p.OfflineDir()}
	return c
}

func read(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// check checks one command line and says what checked each of its
// commands.
func (c *checker) check(line string) (how []string, err error) {
	cmds, err := splitLine(line)
	if err != nil {
		return nil, err
	}
	for _, s := range cmds {
		if err := c.checkPaths(s); err != nil {
			return nil, err
		}
		h, err := c.checkCommand(s.words)
		if err != nil {
			label := s.words[0]
			if h != "" {
				label, _, _ = strings.Cut(h, ":") // kubectl unbounded
			}
			return nil, fmt.Errorf("%s: %w", label, err)
		}
		how = append(how, h)
	}
	return how, nil
}

func (c *checker) checkCommand(w []string) (how string, err error) {
	name, args := w[0], w[1:]
	switch name {
	case "unbounded":
		return "unbounded: parsed by its kong model (lib/cli)", cli.Parse(args)
	case "kubectl-unbounded":
		return "kubectl-unbounded: parsed by its kong model (lib/kubectlplugin)", kubectlplugin.Parse(args)
	case "kubectl":
		verb := ""
		for i := 0; i < len(args); i++ {
			a := args[i]
			if slices.Contains([]string{"--kubeconfig", "--context", "-n", "--namespace"}, a) {
				i++ // and its value
				continue
			}
			if strings.HasPrefix(a, "-") {
				continue
			}
			verb = a
			if verb == "unbounded" {
				return "kubectl unbounded: parsed by its kong model (lib/kubectlplugin)", kubectlplugin.Parse(args[i+1:])
			}
			break
		}
		why, ok := kubectlVerbs[verb]
		if !ok {
			return "", fmt.Errorf("kubectl %q is neither the plugin nor a verb the docs test accepts (kubectlVerbs)", verb)
		}
		return "kubectl " + verb + ": accepted by name (" + why + ")", nil
	case "systemctl":
		return "systemctl: units looked up in units/", c.checkSystemctl(args)
	case "journalctl":
		return "journalctl: units looked up in units/", c.checkJournalctl(args)
	case "make":
		for _, a := range args {
			if strings.HasPrefix(a, "-") || strings.Contains(a, "=") {
				continue
			}
			if !c.targets[a] {
				return "", fmt.Errorf("the Makefile has no target %q", a)
			}
		}
		return "make: targets looked up in the Makefile", nil
	case "man":
		for _, a := range args {
			if strings.HasPrefix(a, "-") || strings.Trim(a, "0123456789") == "" {
				continue
			}
			if !c.manPages[a] {
				return "", fmt.Errorf("the packages install no man page %q (deb/nfpm.yaml)", a)
			}
		}
		return "man: pages looked up in deb/nfpm.yaml", nil
	}
	if why := byName[name]; why != "" {
		return name + ": accepted by name (" + why + ")", nil
	}
	return "", fmt.Errorf("a command the docs test does not know: check it in tests/docs, or accept it by name in byName with the reason")
}

// unit says whether a unit name (a glob too) is one the agent ships or
// configures.
func (c *checker) unit(name string) bool {
	if !strings.Contains(name, ".") && !strings.ContainsAny(name, "*?[") {
		name += ".service" // as systemctl reads it
	}
	for _, u := range c.units {
		if ok, _ := path.Match(name, u); ok || u == name {
			return true
		}
		// An instance of a shipped template.
		if at := strings.Index(u, "@."); at > 0 && strings.HasPrefix(name, u[:at+1]) && strings.HasSuffix(name, u[at+1:]) {
			return true
		}
	}
	return false
}

func (c *checker) checkSystemctl(args []string) error {
	withValue := []string{"-p", "--property", "-M", "--machine", "-H", "--host", "-t", "--type", "--state", "-n", "--lines", "-o", "--output", "--root"}
	verb, takesUnits := "", false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			if slices.Contains(withValue, a) {
				i++
			}
			continue
		}
		if verb == "" {
			units, ok := systemctlVerbs[a]
			if !ok {
				return fmt.Errorf("verb %q is not one the docs test knows (systemctlVerbs)", a)
			}
			verb, takesUnits = a, units
			continue
		}
		if !takesUnits {
			return fmt.Errorf("%s takes no unit, got %q", verb, a)
		}
		if !c.unit(a) {
			return fmt.Errorf("no unit %q in units/ (nor an instance of a template there, nor a slot's machine)", a)
		}
	}
	return nil
}

func (c *checker) checkJournalctl(args []string) error {
	withValue := []string{"-n", "--lines", "-o", "--output", "-p", "--priority", "-S", "--since", "-U", "--until", "-t", "--identifier"}
	machine := ""
	var units []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-u" || a == "--unit" || a == "-M" || a == "--machine":
			if i+1 == len(args) {
				return fmt.Errorf("%s without its value", a)
			}
			if a == "-u" || a == "--unit" {
				units = append(units, args[i+1])
			} else {
				machine = args[i+1]
			}
			i++
		case strings.HasPrefix(a, "--unit="):
			units = append(units, strings.TrimPrefix(a, "--unit="))
		case strings.HasPrefix(a, "--machine="):
			machine = strings.TrimPrefix(a, "--machine=")
		case slices.Contains(withValue, a):
			i++
		}
	}
	if machine != "" && !hostpaths.ValidSlot(machine) {
		return fmt.Errorf("machine %q is not a slot", machine)
	}
	for _, u := range units {
		if machine != "" {
			if u != unitnames.MachineKubelet && u != unitnames.MachineContainerd {
				return fmt.Errorf("no unit %q in the node machine (%s, %s)", u, unitnames.MachineKubelet, unitnames.MachineContainerd)
			}
			continue
		}
		if !c.unit(u) {
			return fmt.Errorf("no unit %q in units/ (nor an instance of a template there, nor a slot's machine)", u)
		}
	}
	return nil
}

// checkPaths checks every path of s under the agent's directories: its
// words (also a flag's value) and its redirections' targets, and for cp
// and install into such a directory, the files they put there.
func (c *checker) checkPaths(s simple) error {
	var paths []string
	for _, w := range append(slices.Clone(s.words), s.redirects...) {
		if i := strings.Index(w, "="); strings.HasPrefix(w, "-") && i > 0 {
			w = w[i+1:]
		}
		paths = append(paths, w)
	}
	if name := s.words[0]; name == "cp" || name == "install" {
		var operands []string
		for i := 1; i < len(s.words); i++ {
			w := s.words[i]
			if strings.HasPrefix(w, "-") {
				if name == "install" && (w == "-m" || w == "-o" || w == "-g") {
					i++
				}
				continue
			}
			operands = append(operands, w)
		}
		if n := len(operands); n >= 2 && under(operands[n-1]) && (strings.HasSuffix(operands[n-1], "/") || n > 2) {
			for _, src := range operands[:n-1] {
				paths = append(paths, path.Join(operands[n-1], path.Base(src)))
			}
		}
	}
	for _, p := range paths {
		if !under(p) {
			continue
		}
		clean := path.Clean(p)
		if c.paths[clean] || slices.Contains(c.dropDirs, path.Dir(clean)) {
			continue
		}
		return fmt.Errorf("path %s: the code names no such path (lib/hostpaths, lib/fleet's host files, deb/nfpm.yaml, the concerns of deb/build-packages.sh)", p)
	}
	return nil
}

// under says whether p is in one of the agent's host directories.
func under(p string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

func TestEveryCommandTheREADMEShowsIsOneTheCodeAccepts(t *testing.T) {
	c := newChecker(t)
	seen := map[string]int{}
	for _, file := range documents {
		cmds, problems := extract(file, read(t, file))
		for _, p := range problems {
			t.Error(p)
		}
		for _, s := range cmds {
			how, err := c.check(s.text)
			if err != nil {
				t.Errorf("%s\n\t%v", s, err)
				continue
			}
			for _, h := range how {
				if testing.Verbose() { // on a failure, only the failures
					t.Logf("%s:%d: %s", s.file, s.line, h)
				}
				seen[strings.SplitN(h, ":", 2)[0]]++
			}
		}
	}
	// An extraction that finds nothing would check nothing: the README
	// shows each kind of command the checker reads.
	for _, kind := range []string{"unbounded", "kubectl unbounded", "systemctl", "journalctl", "make", "man"} {
		if seen[kind] == 0 {
			t.Errorf("no %s command found in %v: is the extraction broken?", kind, documents)
		}
	}
}

// The check fails where the code does not have what a command asks for,
// and on a block it would not read.
func TestTheCheckRefusesWhatTheCodeDoesNotHave(t *testing.T) {
	c := newChecker(t)
	for _, line := range []string{
		"unbounded status --bogus",
		"unbounded frobnicate",
		"unbounded logs etcd",
		"kubectl unbounded join site-w1 --frobnicate",
		"kubectl unbounded get -o table",
		"kubectl-unbounded repave --max-unavailable two",
		"kubectl delete node site-w1",
		"systemctl start unbounded-nope.service",
		"systemctl start unbounded-nope",
		"systemctl frobnicate unbounded-repave.service",
		"journalctl -u unbounded-nope.service",
		"journalctl -M kube1 -u unbounded-daemon.service",
		"make nope",
		"man unbounded-nope",
		"frobnicate --now",
		"install -m 0600 token /etc/unbounded/token",
		"install -m 0644 host/agent.toml host/nope.crt /etc/unbounded/",
		"cp x.deb /var/lib/unbounded/upgrade/nope/",
		"unbounded status >/var/lib/unbounded/nope.json",
		"unbounded config check --file=/etc/unbounded/nope.toml",
		"echo $(unbounded version)",
		"unbounded status | frobnicate",
	} {
		how, err := c.check(line)
		if err == nil {
			t.Errorf("%q passed (%v), want a failure", line, how)
			continue
		}
		t.Logf("%s\n\t%v", line, err)
	}
	for _, line := range []string{
		"UNBOUNDED_DEMO_MODE=none make demo",
		"unbounded manifests | kubectl apply -f -",
		"systemctl start --no-block unbounded-bootstrap.service; unbounded status --follow",
		"systemctl cat systemd-nspawn@kube1.service",
		"systemctl status unbounded-recover@unbounded-bootstrap.service.service",
		"journalctl -M kube1 -u kubelet.service -f",
		"install -m 0644 host/agent.toml host/ca.crt /etc/unbounded/",
		"cp unbounded-agent_0.2.0_amd64.deb /var/lib/unbounded/upgrade/staged/",
		"unbounded config check --file=/etc/unbounded/agent.toml.d/10-site.toml",
	} {
		if _, err := c.check(line); err != nil {
			t.Errorf("%q: %v", line, err)
		}
	}
	for doc, want := range map[string]string{
		"text\n\n    unbounded status --bogus\n": "an indented code block",
		"```\nunbounded status\n```\n":           "a fence without a language",
		"```console\n$ unbounded status\n```\n":  `fence language "console"`,
		"```sh\nunbounded status \\\n```\n":      "ends in a continued line",
		"```sh\nunbounded status\n":              "never ends",
	} {
		_, problems := extract("doc.md", doc)
		if !strings.Contains(strings.Join(problems, "\n"), want) {
			t.Errorf("%q: problems %q, want %q", doc, problems, want)
		}
	}
	cmds, _ := extract("doc.md", "```sh\n# a comment\nunbounded status \\\n  --follow   # and one\n\nmake test\n```\n")
	if len(cmds) != 2 || cmds[0].text != "unbounded status --follow   # and one" || cmds[0].line != 3 || cmds[1].line != 6 {
		t.Errorf("extract: %+v", cmds)
	}
}
