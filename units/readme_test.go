package units_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/unitnames"
)

// The README promises only what ships (ARCHITECTURE section 6): its "What
// ships today" table says, per concern, whether its unit is in units/, and
// no paragraph names a unit that is not shipped unless it says so.

// unitName matches a unit name of the project as the README spells it.
var unitName = regexp.MustCompile(`unbounded-[a-z0-9-]+@?\.(?:service|target|timer|path|socket)`)

// notShippedMarker is what a README paragraph must say to name a unit that
// is not in units/.
const notShippedMarker = "not shipped yet"

type shipRow struct {
	units []string
	ships bool
	line  string
}

// readmeShipTable parses the rows of the "What ships today" table.
func readmeShipTable(t *testing.T, readme string) (rows []shipRow, tableLines map[string]bool) {
	t.Helper()
	tableLines = map[string]bool{}
	start := strings.Index(readme, "## What ships today")
	if start < 0 {
		t.Fatal(`README.md has no "## What ships today" section`)
	}
	section := readme[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("README table row %q: want 3 cells (concern, unit, ships)", line)
		}
		ships := strings.TrimSpace(cells[2])
		if ships == "ships" {
			continue // header
		}
		if ships != "yes" && ships != "no" {
			t.Fatalf("README table row %q: ships is %q, want yes or no", line, ships)
		}
		tableLines[line] = true
		rows = append(rows, shipRow{units: unitName.FindAllString(cells[1], -1), ships: ships == "yes", line: line})
	}
	if len(rows) == 0 {
		t.Fatal(`README.md "What ships today" has no rows`)
	}
	return rows, tableLines
}

func TestReadmeSaysWhatShips(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	shipped := shippedUnits(t)
	rows, tableLines := readmeShipTable(t, readme)

	listed := map[string]bool{}
	for _, r := range rows {
		for _, u := range r.units {
			listed[u] = true
			has := slices.Contains(shipped, u)
			switch {
			case r.ships && !has:
				t.Errorf("README says %s ships, but units/ has no such unit (row %q)", u, r.line)
			case !r.ships && has:
				t.Errorf("README says %s does not ship, but units/%s exists: update the table (row %q)", u, u, r.line)
			}
		}
	}
	for _, u := range shipped {
		if !listed[u] {
			t.Errorf("units/%s ships but the README's table does not list it", u)
		}
	}

	// Outside the table, a paragraph that names a unit which is not
	// shipped must say so. The older agent's units (unitnames.Legacy),
	// which an adoption and reset remove, are not this agent's to ship.
	for _, para := range strings.Split(readme, "\n\n") {
		var kept []string
		for _, line := range strings.Split(para, "\n") {
			if !tableLines[line] {
				kept = append(kept, line)
			}
		}
		text := strings.Join(kept, "\n")
		flat := strings.Join(strings.Fields(text), " ") // the marker may wrap
		for _, u := range unitName.FindAllString(text, -1) {
			if !slices.Contains(shipped, u) && !slices.Contains(unitnames.Legacy, u) && !strings.Contains(flat, notShippedMarker) {
				t.Errorf("README names %s, which is not shipped, in a paragraph that does not say %q:\n%s", u, notShippedMarker, text)
			}
		}
	}
}
