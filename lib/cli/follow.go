package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/unitnames"
)

// followed are the units whose runs `unbounded status --follow` follows:
// the one-shots that change the node.
var followed = []string{unitnames.Bootstrap, unitnames.Repave, unitnames.Restart, unitnames.Upgrade, unitnames.Reset}

// unitView is what systemctl show says of one unit.
type unitView struct {
	ID, Active, Status, Result, Exit, Invocation string
}

func (v unitView) running() bool {
	return v.Active == "activating" || v.Active == "deactivating" || v.Active == "reloading"
}

// showUnits asks systemctl about units (one `systemctl show` for all).
func (env *Env) showUnits(units []string) (map[string]unitView, error) {
	run := env.RunTool
	if run == nil {
		run = runTool
	}
	var out, errb bytes.Buffer
	argv := append([]string{"systemctl", "show", "-p", "Id,ActiveState,StatusText,Result,ExecMainStatus,InvocationID"}, units...)
	code, err := run(argv, nil, strings.NewReader(""), &out, &errb)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit status %d: %s", code, strings.TrimSpace(errb.String()))
	}
	if err != nil {
		return nil, fmt.Errorf("systemctl show: %w", err)
	}
	views := map[string]unitView{}
	var v unitView
	flush := func() {
		if v.ID != "" {
			views[v.ID] = v
		}
		v = unitView{}
	}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		k, val, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			flush()
			continue
		}
		switch k {
		case "Id":
			v.ID = val
		case "ActiveState":
			v.Active = val
		case "StatusText":
			v.Status = val
		case "Result":
			v.Result = val
		case "ExecMainStatus":
			v.Exit = val
		case "InvocationID":
			v.Invocation = val
		}
	}
	flush()
	return views, sc.Err()
}

// follow shows the run of the operation unit that runs now (or starts
// within startWait: `systemctl start --no-block` queues a job that may
// not have begun yet): each STATUS= it shows, once, with the time since
// the run began and what the step before it took, until the run ends.
// A failed run is the command's failure (its exit status).
func (env *Env) follow(w io.Writer, startWait, poll time.Duration, now func() time.Time) error {
	var cur unitView
	begin := now()
	for cur.ID == "" {
		views, err := env.showUnits(followed)
		if err != nil {
			return err
		}
		for _, u := range followed {
			if v := views[u]; v.running() {
				cur = v
				break
			}
		}
		if cur.ID != "" {
			break
		}
		if now().Sub(begin) >= startWait {
			fmt.Fprintf(w, "no operation runs (%s)\n", strings.Join(followed, ", "))
			return nil
		}
		time.Sleep(poll)
	}
	begin = now()
	fmt.Fprintf(w, "following %s\n", cur.ID)
	last, stepBegan := "", begin
	show := func(v unitView) {
		if v.Status == "" || v.Status == last {
			return
		}
		t := now()
		took := ""
		if last != "" {
			took = fmt.Sprintf("  (%s)", t.Sub(stepBegan).Round(100*time.Millisecond))
		}
		fmt.Fprintf(w, "%8s  %s%s\n", t.Sub(begin).Round(100*time.Millisecond), v.Status, took)
		last, stepBegan = v.Status, t
	}
	show(cur)
	for {
		time.Sleep(poll)
		views, err := env.showUnits([]string{cur.ID})
		if err != nil {
			return err
		}
		v := views[cur.ID]
		if v.running() && (v.Invocation == cur.Invocation || cur.Invocation == "") {
			show(v)
			continue
		}
		elapsed := now().Sub(begin).Round(100 * time.Millisecond)
		if v.Active == "failed" || (v.Result != "" && v.Result != "success") {
			fmt.Fprintf(w, "%s failed after %s: result %s, exit status %s\n", cur.ID, elapsed, v.Result, v.Exit)
			if code := atoiOr(v.Exit, 1); code != 0 {
				return silentError{childExit(code)}
			}
			return silentError{childExit(1)}
		}
		fmt.Fprintf(w, "%s finished after %s: %s\n", cur.ID, elapsed, orDash(v.Result))
		return nil
	}
}

func atoiOr(s string, def int) int {
	n := 0
	if s == "" {
		return def
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return def
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
