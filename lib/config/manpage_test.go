package config

import (
	"bytes"
	"strings"
	"testing"
)

// unbounded-agent.toml(5) lists every key the loader accepts, under its
// section, with its default or as required: the page and the schema come
// from the same reference and the same Config type.
func TestManPageListsEveryKeyOfTheSchema(t *testing.T) {
	var b bytes.Buffer
	if err := WriteManPage(&b, "1.2.3"); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if !strings.HasPrefix(page, `unbounded-agent.toml 5 "" "unbounded-agent 1.2.3"`) {
		t.Errorf("title line: %q", strings.SplitN(page, "\n", 2)[0])
	}
	isSection := map[string]bool{}
	for _, s := range sections() {
		isSection[s.path.String()] = true
	}
	for _, s := range sections() {
		heading := "## Top level\n"
		if len(s.path) > 0 {
			heading = "## [" + s.path.String() + "]\n"
		}
		i := strings.Index(page, heading)
		if i < 0 {
			t.Errorf("no section %q", heading)
			continue
		}
		body := page[i+len(heading):]
		if j := strings.Index(body, "\n#"); j >= 0 {
			body = body[:j]
		}
		for _, k := range tomlKeys(s.typ) {
			if len(s.path) == 0 && isSection[k] {
				continue
			}
			if !strings.Contains(body, "**"+k+"** = ") && !strings.Contains(body, "**"+k+"** (required)") {
				t.Errorf("key %s not documented under %q:\n%s", k, heading, body)
			}
		}
	}
	for _, k := range []string{"machine", "api-server", "kubernetes-version"} {
		if !strings.Contains(page, "**"+k+"** (required)") {
			t.Errorf("%s is not shown as required", k)
		}
	}
	if !strings.Contains(page, `**retry-budget** = "2m"`) {
		t.Error("fence.retry-budget's default is not shown")
	}
}
