package cli

// The man pages unbounded(1) and unbounded-agent.toml(5), as markdown for
// go-md2man, generated from the same models as --help and the completion
// scripts: the kong model of the command line and the reference
// configuration. `make man` converts them (go-md2man is a tool of
// tools/go.mod, so the CLI links no markdown renderer); the packages ship
// the result.

import (
	"fmt"
	"io"
	"strings"

	"github.com/alecthomas/kong"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/version"
)

// manPages are the pages `unbounded __man` writes, by file name.
var manPages = map[string]func(io.Writer) error{
	"unbounded.1":            writeCLIManPage,
	"unbounded-agent.toml.5": func(w io.Writer) error { return config.WriteManPage(w, version.Version) },
}

// manCmd is hidden: it is for the build, not for operators (who read the
// installed pages with man).
type manCmd struct {
	Page string `arg:"" enum:"unbounded.1,unbounded-agent.toml.5" help:"The page to write as markdown."`
}

func (m *manCmd) Run(env *Env) error { return manPages[m.Page](env.Stdout) }

// mdEscape escapes what markdown would take for formatting in help text
// ("FILE.d/*.toml", "snake_case").
func mdEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, "*", `\*`, "_", `\_`, "`", "\\`", "<", `\<`, "[", `\[`).Replace(s)
}

// flagTerm is a flag as the term of a definition list: **--root**=*DIR*.
func flagTerm(f *kong.Flag) string {
	t := "**--" + f.Name + "**"
	if f.Short != 0 {
		t = "**-" + string(f.Short) + "**, " + t
	}
	if !f.IsBool() && !f.IsCounter() {
		t += "=*" + mdEscape(f.FormatPlaceHolder()) + "*"
	}
	return t
}

func definition(w *strings.Builder, term, text string) {
	fmt.Fprintf(w, "%s\n:   %s\n\n", term, mdEscape(text))
}

func writeCLIManPage(out io.Writer) error {
	app := Model()
	var w strings.Builder
	fmt.Fprintf(&w, "unbounded 1 \"\" \"unbounded-agent %s\" \"User Commands\"\n==========\n\n", version.Version)
	w.WriteString("# NAME\nunbounded - operator command of unbounded-agent\n\n")
	w.WriteString("# SYNOPSIS\n**unbounded** *command* [*flags*]\n\n**unbounded** **--version**\n\n")
	fmt.Fprintf(&w, "# DESCRIPTION\n%s\n\n", mdEscape(Summary))
	w.WriteString("unbounded-agent turns a Linux host into a Kubernetes worker node; systemd units do " +
		"the work, and **unbounded** shows what they did and will do, checks the configuration " +
		"and prints what the cluster needs. Every command only reads the host. Commands that " +
		"read host state take **--root**=*DIR* to read a tree under *DIR* instead of */*.\n\n")
	w.WriteString("# GLOBAL FLAGS\n")
	for _, f := range app.Flags {
		if !f.Hidden {
			definition(&w, flagTerm(f), f.Help)
		}
	}
	w.WriteString("# COMMANDS\n")
	for _, c := range commands(app)[1:] {
		if len(c.subs) > 0 {
			continue // a group ("config"): its commands follow
		}
		syn := "**unbounded " + c.path + "**"
		for _, a := range c.args {
			syn += " *" + strings.ToUpper(a.Name) + "*"
		}
		var own []*kong.Flag
		for _, f := range c.flags {
			if f.Name != "help" && f.Name != "version" {
				own = append(own, f)
			}
		}
		if len(own) > 0 {
			syn += " [*flags*]"
		}
		node := nodeAt(app.Node, c.path)
		fmt.Fprintf(&w, "## %s\n%s\n\n%s\n\n", c.path, syn, mdEscape(node.Help))
		for _, a := range c.args {
			text := a.Help
			if e := enum(a); len(e) > 0 && !strings.Contains(text, e[0]) {
				text += " One of: " + strings.Join(e, ", ") + "."
			}
			definition(&w, "*"+strings.ToUpper(a.Name)+"*", text)
		}
		for _, f := range own {
			definition(&w, flagTerm(f), f.Help)
		}
	}
	w.WriteString("# EXIT STATUS\n")
	for _, c := range ExitCodes {
		definition(&w, fmt.Sprintf("**%d**", c.Code), c.Meaning)
	}
	w.WriteString("# FILES\n")
	definition(&w, "*"+hostpaths.ConfigFileHost+"*", "The configuration, with drop-ins in "+hostpaths.ConfigDropinDirHost+"/*.toml; see unbounded-agent.toml(5).")
	definition(&w, "*"+config.ExampleFile+"*", "The reference configuration: every key with its default (also printed by unbounded config check --reference).")
	definition(&w, "*"+hostpaths.HostRootHost+"*", "The agent's state: applied configs, ownership record, journals, certificates. Readable by root only.")
	w.WriteString("# SEE ALSO\n**unbounded-agent.toml**(5), **systemctl**(1), **systemd.generator**(7)\n")
	_, err := io.WriteString(out, w.String())
	return err
}

// nodeAt finds the command at path ("config check") under n.
func nodeAt(n *kong.Node, path string) *kong.Node {
	for _, name := range strings.Fields(path) {
		for _, ch := range n.Children {
			if ch.Name == name {
				n = ch
				break
			}
		}
	}
	return n
}
