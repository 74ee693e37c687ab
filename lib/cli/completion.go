package cli

// Shell completion for bash, zsh and fish, generated from the kong model of
// the command line (Model), so that a new command or flag completes without
// anyone editing a script.
//
// Why not kongplete (github.com/willabides/kongplete): its last release is
// from 2022, it completes through posener/complete by running `unbounded`
// itself at every TAB (`complete -C`), which makes completion depend on the
// installed binary parsing a COMP_LINE protocol, and it has no fish
// support of its own. These scripts are static shell code, made at build
// time (`unbounded completion SHELL`, see the Makefile) and installed by the
// packages in each shell's standard directory.
//
// All three scripts work the same way: walk the words before the cursor to
// find the command path ("config check") and how many positional arguments
// were given, skipping flags and their values; then offer the value of the
// flag before the cursor (its enum, a directory for --root, a file for a
// path), or flags when the word starts with "-", or subcommands and the
// next positional argument's enum.

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/alecthomas/kong"
)

type completionCmd struct {
	Shell string `arg:"" enum:"bash,zsh,fish" help:"bash, zsh or fish."`
}

func (c *completionCmd) Run(env *Env) error {
	return WriteCompletion(env.Stdout, c.Shell)
}

// command is one node of the model, flattened for the generators.
type command struct {
	path  string // "" for the root, "config check"
	subs  []*kong.Node
	flags []*kong.Flag // this command's and its parents' (kong accepts both)
	args  []*kong.Value
}

// commands lists every visible command of app, depth first.
func commands(app *kong.Application) []command {
	var out []command
	var walk func(n *kong.Node, path string)
	walk = func(n *kong.Node, path string) {
		c := command{path: path, args: n.Positional}
		for _, group := range n.AllFlags(true) {
			c.flags = append(c.flags, group...)
		}
		for _, ch := range n.Children {
			if ch.Hidden || ch.Type != kong.CommandNode {
				continue
			}
			c.subs = append(c.subs, ch)
		}
		out = append(out, c)
		for _, ch := range c.subs {
			walk(ch, strings.TrimSpace(path+" "+ch.Name))
		}
	}
	walk(app.Node, "")
	return out
}

// valueKind is how a flag's value completes: "" (no value: a boolean),
// "enum", "dir", "file" or "any".
func valueKind(f *kong.Flag) string {
	switch {
	case f.IsBool() || f.IsCounter():
		return ""
	case f.Enum != "":
		return "enum"
	case f.Name == "root":
		return "dir"
	case f.Tag != nil && (f.Tag.Type == "path" || f.Tag.Type == "existingfile"):
		return "file"
	}
	return "any"
}

func enum(v *kong.Value) []string {
	var out []string
	for _, e := range v.EnumSlice() {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

func flagNames(f *kong.Flag) []string {
	names := []string{"--" + f.Name}
	if f.Short != 0 {
		names = append(names, "-"+string(f.Short))
	}
	return names
}

// WriteCompletion writes the completion script for shell (bash, zsh, fish).
func WriteCompletion(w io.Writer, shell string) error {
	cmds := commands(Model())
	var s string
	switch shell {
	case "bash":
		s = bashCompletion(cmds)
	case "zsh":
		s = zshCompletion(cmds)
	case "fish":
		s = fishCompletion(cmds)
	default:
		return fmt.Errorf("no completion for shell %q (bash, zsh, fish)", shell)
	}
	_, err := io.WriteString(w, s)
	return err
}

// sq quotes s for any of the three shells inside single quotes.
func sq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// fishSQ quotes s for fish, where \' ends nothing and \\ and \' are escapes.
func fishSQ(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// oneLine is the first sentence-ish line of a help text, for descriptions.
func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.TrimSpace(s)
}

// subPatterns are the bash and zsh case branches that move the walk into
// a subcommand ("config:check" -> path "config check").
func subPatterns(cmds []command) []string {
	var out []string
	for _, c := range cmds {
		for _, s := range c.subs {
			out = append(out, fmt.Sprintf("%s) path=%s ;;", sq(c.path+":"+s.Name), sq(strings.TrimSpace(c.path+" "+s.Name))))
		}
	}
	return out
}

// valueFlagPatterns are the "path:--flag" patterns of the flags that take
// a value, whose next word the walk skips.
func valueFlagPatterns(cmds []command) []string {
	var pats []string
	for _, c := range cmds {
		for _, f := range c.flags {
			if valueKind(f) == "" {
				continue
			}
			for _, n := range flagNames(f) {
				pats = append(pats, sq(c.path+":"+n))
			}
		}
	}
	sort.Strings(pats)
	return slices.Compact(pats)
}

func bashCompletion(cmds []command) string {
	var b strings.Builder
	b.WriteString(`# bash completion for unbounded, generated from its command line model
# (unbounded completion bash). Installed in
# /usr/share/bash-completion/completions/unbounded.

_unbounded() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
	local path="" npos=0 skip=0 i w words=""
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		if ((skip)); then
			skip=0
			continue
		fi
		case "$path:$w" in
`)
	if p := valueFlagPatterns(cmds); len(p) > 0 {
		fmt.Fprintf(&b, "\t\t%s) skip=1; continue ;;\n", strings.Join(p, " | "))
	}
	b.WriteString("\t\tesac\n\t\tcase $w in -*) continue ;; esac\n\t\tcase \"$path:$w\" in\n")
	for _, p := range subPatterns(cmds) {
		b.WriteString("\t\t" + strings.Replace(p, " ;;", "; npos=0 ;;", 1) + "\n")
	}
	b.WriteString("\t\t*) npos=$((npos + 1)) ;;\n\t\tesac\n\tdone\n")
	// The value of the flag before the cursor.
	b.WriteString("\tcase \"$path:$prev\" in\n")
	for _, c := range cmds {
		for _, f := range c.flags {
			var action string
			switch valueKind(f) {
			case "enum":
				action = fmt.Sprintf(`COMPREPLY=($(compgen -W %s -- "$cur"))`, sq(strings.Join(enum(f.Value), " ")))
			case "dir":
				action = `COMPREPLY=($(compgen -d -- "$cur"))`
			case "file":
				action = `COMPREPLY=($(compgen -f -- "$cur"))`
			case "any":
				action = "COMPREPLY=()"
			default:
				continue
			}
			var pats []string
			for _, n := range flagNames(f) {
				pats = append(pats, sq(c.path+":"+n))
			}
			fmt.Fprintf(&b, "\t%s) %s; return ;;\n", strings.Join(pats, " | "), action)
		}
	}
	b.WriteString("\tesac\n\tcase \"$path\" in\n")
	for _, c := range cmds {
		var flags, words []string
		for _, f := range c.flags {
			flags = append(flags, flagNames(f)...)
		}
		for _, s := range c.subs {
			words = append(words, s.Name)
		}
		fmt.Fprintf(&b, "\t%s)\n\t\tcase $cur in -*) words=%s ;; *)\n\t\t\twords=%s\n", sq(c.path), sq(strings.Join(flags, " ")), sq(strings.Join(words, " ")))
		for i, a := range c.args {
			if e := enum(a); len(e) > 0 {
				fmt.Fprintf(&b, "\t\t\t((npos == %d)) && words=%s\n", i, sq(strings.Join(e, " ")))
			}
		}
		b.WriteString("\t\tesac ;;\n")
	}
	b.WriteString("\tesac\n\tCOMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n}\n\ncomplete -F _unbounded unbounded\n")
	return b.String()
}

func zshCompletion(cmds []command) string {
	var b strings.Builder
	b.WriteString(`#compdef unbounded
# zsh completion for unbounded, generated from its command line model
# (unbounded completion zsh). Installed in
# /usr/share/zsh/vendor-completions/_unbounded.

_unbounded() {
	local path_="" npos=0 skip=0 i w
	local prev=${words[CURRENT-1]} cur=${words[CURRENT]}
	local -a items
	for ((i = 2; i < CURRENT; i++)); do
		w=${words[i]}
		if ((skip)); then
			skip=0
			continue
		fi
		case "$path_:$w" in
`)
	if p := valueFlagPatterns(cmds); len(p) > 0 {
		fmt.Fprintf(&b, "\t\t(%s) skip=1; continue ;;\n", strings.Join(p, "|"))
	}
	b.WriteString("\t\tesac\n\t\tcase $w in -*) continue ;; esac\n\t\tcase \"$path_:$w\" in\n")
	for _, p := range subPatterns(cmds) {
		b.WriteString("\t\t" + strings.Replace(strings.Replace(p, "path=", "path_=", 1), " ;;", "; npos=0 ;;", 1) + "\n")
	}
	b.WriteString("\t\t*) npos=$((npos + 1)) ;;\n\t\tesac\n\tdone\n\tcase \"$path_:$prev\" in\n")
	for _, c := range cmds {
		for _, f := range c.flags {
			var action string
			switch valueKind(f) {
			case "enum":
				action = "compadd -- " + strings.Join(enum(f.Value), " ")
			case "dir":
				action = "_files -/"
			case "file":
				action = "_files"
			case "any":
				action = "_message " + sq(f.FormatPlaceHolder())
			default:
				continue
			}
			var pats []string
			for _, n := range flagNames(f) {
				pats = append(pats, sq(c.path+":"+n))
			}
			fmt.Fprintf(&b, "\t(%s) %s; return ;;\n", strings.Join(pats, "|"), action)
		}
	}
	b.WriteString("\tesac\n\tcase \"$path_\" in\n")
	for _, c := range cmds {
		fmt.Fprintf(&b, "\t(%s)\n\t\tif [[ $cur == -* ]]; then\n\t\t\titems=(", sq(c.path))
		for _, f := range c.flags {
			for _, n := range flagNames(f) {
				b.WriteString(" " + sq(strings.ReplaceAll(n, ":", `\:`)+":"+oneLine(f.Help)))
			}
		}
		b.WriteString(" )\n\t\t\t_describe -t flags flag items\n\t\t\treturn\n\t\tfi\n")
		if len(c.subs) > 0 {
			b.WriteString("\t\titems=(")
			for _, s := range c.subs {
				b.WriteString(" " + sq(s.Name+":"+oneLine(s.Help)))
			}
			b.WriteString(" )\n\t\t_describe -t commands command items\n")
		}
		for i, a := range c.args {
			if e := enum(a); len(e) > 0 {
				fmt.Fprintf(&b, "\t\t((npos == %d)) && compadd -- %s\n", i, strings.Join(e, " "))
			}
		}
		b.WriteString("\t\t;;\n")
	}
	b.WriteString("\tesac\n}\n\n_unbounded \"$@\"\n")
	return b.String()
}

func fishCompletion(cmds []command) string {
	var b strings.Builder
	b.WriteString(`# fish completion for unbounded, generated from its command line model
# (unbounded completion fish). Installed in
# /usr/share/fish/vendor_completions.d/unbounded.fish.

# __unbounded_walk prints the command path of the words before the cursor
# ("config check") and the number of positional arguments after it, one
# per line; __unbounded_at PATH [N] tests them.
function __unbounded_walk
	set -l words (commandline -opc)
	set -l path ""
	set -l npos 0
	set -l skip 0
	for w in $words[2..-1]
		if test $skip = 1
			set skip 0
			continue
		end
		switch "$path:$w"
`)
	if p := valueFlagPatterns(cmds); len(p) > 0 {
		var fp []string
		for _, x := range p {
			fp = append(fp, fishSQ(strings.Trim(x, "'")))
		}
		fmt.Fprintf(&b, "\t\tcase %s\n\t\t\tset skip 1\n\t\t\tcontinue\n", strings.Join(fp, " "))
	}
	b.WriteString("\t\tend\n\t\tif string match -q -- '-*' $w\n\t\t\tcontinue\n\t\tend\n\t\tswitch \"$path:$w\"\n")
	for _, c := range cmds {
		for _, s := range c.subs {
			fmt.Fprintf(&b, "\t\tcase %s\n\t\t\tset path %s\n\t\t\tset npos 0\n", fishSQ(c.path+":"+s.Name), fishSQ(strings.TrimSpace(c.path+" "+s.Name)))
		}
	}
	b.WriteString("\t\tcase '*'\n\t\t\tset npos (math $npos + 1)\n\t\tend\n\tend\n\techo $path\n\techo $npos\nend\n\n")
	b.WriteString("function __unbounded_at\n\tset -l r (__unbounded_walk)\n\ttest \"$r[1]\" = \"$argv[1]\"; and begin; test (count $argv) -lt 2; or test \"$r[2]\" = \"$argv[2]\"; end\nend\n\n")
	b.WriteString("complete -c unbounded -f\n")
	for _, c := range cmds {
		cond := "__unbounded_at " + fishSQ(c.path)
		for _, s := range c.subs {
			fmt.Fprintf(&b, "complete -c unbounded -n %s -a %s -d %s\n", fishSQ(cond), fishSQ(s.Name), fishSQ(oneLine(s.Help)))
		}
		for i, a := range c.args {
			if e := enum(a); len(e) > 0 {
				fmt.Fprintf(&b, "complete -c unbounded -n %s -a %s -d %s\n", fishSQ(fmt.Sprintf("__unbounded_at %s %d", fishSQ(c.path), i)), fishSQ(strings.Join(e, " ")), fishSQ(oneLine(a.Help)))
			}
		}
		for _, f := range c.flags {
			line := "complete -c unbounded -n " + fishSQ(cond) + " -l " + f.Name
			if f.Short != 0 {
				line += " -s " + string(f.Short)
			}
			switch valueKind(f) {
			case "enum":
				line += " -x -a " + fishSQ(strings.Join(enum(f.Value), " "))
			case "dir":
				line += " -x -a '(__fish_complete_directories)'"
			case "file":
				line += " -r -F"
			case "any":
				line += " -x"
			}
			b.WriteString(line + " -d " + fishSQ(oneLine(f.Help)) + "\n")
		}
	}
	return b.String()
}
