package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// script writes the completion script for shell into a temporary file.
func script(t *testing.T, shell string) string {
	t.Helper()
	var b bytes.Buffer
	if r := Main([]string{"completion", shell}, Env{Stdout: &b, Stderr: &b}); r != 0 {
		t.Fatalf("completion %s: exit %d: %s", shell, r, b.String())
	}
	f := filepath.Join(t.TempDir(), shell)
	if err := os.WriteFile(f, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func shellOut(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", name, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// sorted turns a shell's answer (one candidate per line or word, fish
// adding a tab and a description) into sorted, space-separated names.
func sorted(s string) string {
	var names []string
	for _, line := range strings.Split(s, "\n") {
		name, _, _ := strings.Cut(line, "\t")
		names = append(names, strings.Fields(name)...)
	}
	slices.Sort(names)
	return strings.Join(names, " ")
}

// completions lists, for the words typed after "unbounded" (the last one
// is being completed), what every shell must offer.
var completions = []struct {
	words []string
	want  string
}{
	{[]string{"sta"}, "status"},
	{[]string{"config", ""}, "check"},
	{[]string{"config", "check", "--re"}, "--reference"},
	{[]string{"supports-isolation", ""}, "container none nspawn"},
	{[]string{"supports-isolation", "--json", "n"}, "none nspawn"},
	{[]string{"supports-isolation", "none", ""}, ""},
	{[]string{"completion", "f"}, "fish"},
	{[]string{"status", "--root", "/tmp", "--j"}, "--json"},
}

// everyCommand is every visible command of the model, as "unbounded <TAB>"
// must offer: a new command completes without anyone editing a script.
func everyCommand(t *testing.T) string {
	var names []string
	for _, c := range commands(Model())[0].subs {
		names = append(names, c.Name)
	}
	if !slices.Contains(names, "status") || !slices.Contains(names, "config") {
		t.Fatalf("model has no status or config command: %v", names)
	}
	return sorted(strings.Join(names, " "))
}

// check runs complete(words) for the table, "unbounded <TAB>" and --root.
func check(t *testing.T, shell string, complete func(words ...string) string) {
	t.Helper()
	if got, want := sorted(complete("")), everyCommand(t); got != want {
		t.Errorf("%s: unbounded <TAB>: got %q, want %q", shell, got, want)
	}
	for _, tc := range completions {
		if got := sorted(complete(tc.words...)); got != tc.want {
			t.Errorf("%s: unbounded %s<TAB>: got %q, want %q", shell, strings.Join(tc.words, " "), got, tc.want)
		}
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, _, _ := strings.Cut(complete("status", "--root", dir+"/ro"), "\t")
	if strings.TrimSuffix(got, "/") != dir+"/rootfs" {
		t.Errorf("%s: --root completes %q, want the directory %s/rootfs", shell, got, dir)
	}
}

func TestBashCompletionCompletesCommandsFlagsAndValues(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash is not installed")
	}
	f := script(t, "bash")
	shellOut(t, bash, "-n", f)
	check(t, "bash", func(words ...string) string {
		return shellOut(t, bash, append([]string{"-c",
			`f=$1; shift; source "$f"; COMP_WORDS=(unbounded "$@"); COMP_CWORD=$#; _unbounded; printf '%s\n' "${COMPREPLY[@]}"`, "_", f}, words...)...)
	})
}

func TestFishCompletionCompletesCommandsFlagsAndValues(t *testing.T) {
	fish, err := exec.LookPath("fish")
	if err != nil {
		t.Skip("fish is not installed (apt-get install fish; .ci/run does)")
	}
	f := script(t, "fish")
	shellOut(t, fish, "--no-execute", f)
	check(t, "fish", func(words ...string) string {
		// complete -C asks fish what it would offer for this command line.
		line := "unbounded " + strings.Join(words, " ")
		return shellOut(t, fish, "--no-config", "-c", `source $argv[1]; complete -C $argv[2]`, f, line)
	})
}

// zsh's completion system needs a terminal; its builtins that offer
// candidates (compadd, _describe, _files) are replaced by functions that
// print them, and _unbounded runs with words and CURRENT set as zsh sets
// them.
func TestZshCompletionCompletesCommandsFlagsAndValues(t *testing.T) {
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		t.Skip("zsh is not installed (apt-get install zsh; .ci/run does)")
	}
	f := script(t, "zsh")
	shellOut(t, zsh, "-n", f)
	const harness = `
offer() { local x; for x; do [[ $x == ${cur}* ]] && print -r -- $x; done; true; }
compadd() { [[ $1 == -- ]] && shift; offer "$@"; }
_describe() { local -a described; described=("${(@P)4}"); offer "${described[@]%%:*}"; }
_files() { [[ $1 == -/ ]] && print -rl -- ${cur}*(/N) || print -rl -- ${cur}*(N); }
_message() { :; }
f=$1; shift
words=(unbounded); CURRENT=1
source "$f" >/dev/null
words=(unbounded "$@"); CURRENT=${#words}
_unbounded || true # 1 is "no match"
`
	check(t, "zsh", func(words ...string) string {
		return shellOut(t, zsh, append([]string{"-f", "-c", harness, "_", f}, words...)...)
	})
}
