package steps

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// journal is an operation's journal as bootstrap's is shaped: fields of
// its own around the embedded Record.
type journal struct {
	Input string `json:"input"`
	Record
	Tries int `json:"tries,omitempty"`
}

// world is one operation on a scratch host: the runner, and what its
// steps, STATUS= lines and crash points did, in order.
type world struct {
	p      hostpaths.Paths
	j      *journal
	events []string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return &world{p: hostpaths.New(t.TempDir()), j: &journal{Input: "in"}}
}

func (w *world) runner() *Runner {
	return &Runner{
		Paths: w.p, Operation: "op", Journal: w.j,
		Notify:     func(s string) { w.events = append(w.events, s) },
		CrashPoint: func(name string) { w.events = append(w.events, "crash "+name) },
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// step is a step that records its run, and fails with err when set.
func (w *world) step(name string, err error) Step {
	return Step{Name: name, Status: "doing " + name, Run: func(context.Context) error {
		w.events = append(w.events, "run "+name)
		return err
	}}
}

func (w *world) read(t *testing.T) (*journal, bool) {
	t.Helper()
	var j journal
	ok, err := state.ReadJournal(w.p, "op", &j)
	if err != nil {
		t.Fatal(err)
	}
	return &j, ok
}

func TestStepsRunInOrderEachShownJournaledThenCrashPoint(t *testing.T) {
	w := newWorld(t)
	r := w.runner()
	// At each crash point, the journal on disk already says the step is
	// done: a crash there resumes after it.
	var journaled [][]string
	r.CrashPoint = func(name string) {
		w.events = append(w.events, "crash "+name)
		j, _ := w.read(t)
		journaled = append(journaled, j.Done)
	}
	if err := r.Run(context.Background(), []Step{w.step("a", nil), w.step("b", nil), w.step("c", nil)}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"STATUS=step a: doing a", "run a", "crash op/after-a",
		"STATUS=step b: doing b", "run b", "crash op/after-b",
		"STATUS=step c: doing c", "run c", "crash op/after-c",
	}
	if !slices.Equal(w.events, want) {
		t.Errorf("events\n got %q\nwant %q", w.events, want)
	}
	if fmt.Sprint(journaled) != "[[a] [a b] [a b c]]" {
		t.Errorf("journaled at the crash points: %v", journaled)
	}
	j, ok := w.read(t)
	if !ok || j.Input != "in" || j.Step != "c" || !slices.Equal(j.Done, []string{"a", "b", "c"}) {
		t.Errorf("journal %+v (found %v)", j, ok)
	}
}

func TestAStepJournaledDoneIsSkippedUnlessItRunsEveryTime(t *testing.T) {
	w := newWorld(t)
	w.j.Done = []string{"a", "b"}
	b := w.step("b", nil)
	b.Always = true
	if err := w.runner().Run(context.Background(), []Step{w.step("a", nil), b, w.step("c", nil)}); err != nil {
		t.Fatal(err)
	}
	var ran []string
	for _, e := range w.events {
		if name, ok := strings.CutPrefix(e, "run "); ok {
			ran = append(ran, name)
		}
	}
	if !slices.Equal(ran, []string{"b", "c"}) {
		t.Errorf("ran %q, want b (every run) and c", ran)
	}
	if slices.Contains(w.events, "crash op/after-a") {
		t.Errorf("a crash point after a skipped step: %q", w.events)
	}
	if !slices.Equal(w.j.Done, []string{"a", "b", "c"}) {
		t.Errorf("done %q, want each step once", w.j.Done)
	}
}

func TestAFailureKeepsTheStepAndItsReasonAndTheExitCode(t *testing.T) {
	w := newWorld(t)
	cause := fmt.Errorf("%w: mirror unreachable", exitcode.ErrTemporary)
	r := w.runner()
	r.Label = "phase"
	err := r.Run(context.Background(), []Step{w.step("a", nil), w.step("b", cause), w.step("c", nil)})
	var se *Error
	if !errors.As(err, &se) || se.Step != "b" || se.Err != cause {
		t.Fatalf("error %#v, want the failure of step b", err)
	}
	if err.Error() != "phase b: temporary failure: mirror unreachable" {
		t.Errorf("message %q", err.Error())
	}
	if exitcode.For(err) != exitcode.TempFail || !errors.Is(err, exitcode.ErrTemporary) {
		t.Errorf("exit %d: the step's error must show through", exitcode.For(err))
	}
	if step, c := Failed(err); step != "b" || c != cause {
		t.Errorf("Failed = %q, %v", step, c)
	}
	if step, c := Failed(cause); step != "" || c != cause {
		t.Errorf("Failed of no step's error = %q, %v", step, c)
	}
	if w.j.Step != "b failed: temporary failure: mirror unreachable" || !slices.Equal(w.j.Done, []string{"a"}) {
		t.Errorf("record %+v, want b's failure and a done", w.j.Record)
	}
	if slices.Contains(w.events, "run c") || slices.Contains(w.events, "crash op/after-b") {
		t.Errorf("went on past the failure: %q", w.events)
	}
	// The reason a journal keeps is bounded.
	w.j.SetFailed("b", strings.Repeat("x", 2*MaxReason))
	if len(w.j.Step) > len("b failed: ")+MaxReason || !strings.HasSuffix(w.j.Step, "...") {
		t.Errorf("a long reason kept as %d bytes", len(w.j.Step))
	}
}

func TestAJournalThatCannotBeWrittenFailsTheStep(t *testing.T) {
	w := newWorld(t)
	// A file where the journal directory belongs.
	if err := os.MkdirAll(w.p.HostRoot(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.p.JournalDir(), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := w.runner().Run(context.Background(), []Step{w.step("a", nil), w.step("b", nil)})
	var se *Error
	if !errors.As(err, &se) || se.Step != "a" || !strings.Contains(err.Error(), "journal was not written") {
		t.Fatalf("error %v, want step a's failure naming the journal", err)
	}
	if slices.Contains(w.events, "crash op/after-a") || slices.Contains(w.events, "run b") {
		t.Errorf("went on without a journal: %q", w.events)
	}
}

func TestAnInterruptedRunResumesFromTheJournal(t *testing.T) {
	w := newWorld(t)
	steps := func(failB error) []Step { return []Step{w.step("a", nil), w.step("b", failB), w.step("c", nil)} }
	if err := w.runner().Run(context.Background(), steps(errors.New("disk full"))); err == nil {
		t.Fatal("no error from a failing step")
	}
	// The operation's failure path journals the failure.
	if err := state.WriteJournal(w.p, "op", w.j); err != nil {
		t.Fatal(err)
	}
	j, _ := w.read(t)
	if j.Step != "b failed: disk full" {
		t.Errorf("journaled step %q", j.Step)
	}
	w.j, w.events = j, nil
	if err := w.runner().Run(context.Background(), steps(nil)); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(w.events, "run a") || !slices.Contains(w.events, "run b") || !slices.Contains(w.events, "run c") {
		t.Errorf("resumed run: %q, want b and c only", w.events)
	}
}

// A journal written before this package existed has the same field
// names; a host upgraded mid-operation resumes it.
func TestAJournalOfThePreviousFormatResumes(t *testing.T) {
	w := newWorld(t)
	old := `{
  "input": "in",
  "done": [
    "a",
    "b"
  ],
  "step": "b",
  "tries": 2
}
`
	if err := state.WriteVerified(w.p.Journal("op"), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	j, ok := w.read(t)
	if !ok || j.Tries != 2 || j.Step != "b" {
		t.Fatalf("old journal read as %+v", j)
	}
	w.j = j
	if err := w.runner().Run(context.Background(), []Step{w.step("a", nil), w.step("b", nil), w.step("c", nil)}); err != nil {
		t.Fatal(err)
	}
	if got := slices.DeleteFunc(slices.Clone(w.events), func(e string) bool { return !strings.HasPrefix(e, "run ") }); !slices.Equal(got, []string{"run c"}) {
		t.Errorf("ran %q, want only c", got)
	}
}

func TestAnUnjournaledStepIsWrittenWithTheNextAndAFinalStepRemovesTheJournal(t *testing.T) {
	w := newWorld(t)
	r := w.runner()
	var seen []string
	r.CrashPoint = func(name string) {
		j, ok := w.read(t)
		seen = append(seen, fmt.Sprintf("%s %v %v", name, ok, j.Done))
	}
	var done []string
	r.OnDone = func(step string) { done = append(done, step) }
	a := w.step("a", nil)
	a.Unjournaled = true
	c := w.step("c", nil)
	c.Final = true
	if err := r.Run(context.Background(), []Step{a, w.step("b", nil), c}); err != nil {
		t.Fatal(err)
	}
	want := []string{"op/after-a false []", "op/after-b true [a b]", "op/after-c false []"}
	if !slices.Equal(seen, want) {
		t.Errorf("journal at the crash points\n got %q\nwant %q", seen, want)
	}
	if !slices.Equal(done, []string{"a", "b", "c"}) {
		t.Errorf("OnDone %q", done)
	}
	// Forget: a step undone by the operation runs again.
	w.j.Forget("b", "c")
	if !slices.Equal(w.j.Done, []string{"a"}) {
		t.Errorf("after Forget: %q", w.j.Done)
	}
}

func TestANilRunIsJournaledOnly(t *testing.T) {
	w := newWorld(t)
	if err := w.runner().Run(context.Background(), []Step{{Name: "plan"}}); err != nil {
		t.Fatal(err)
	}
	if j, ok := w.read(t); !ok || !slices.Equal(j.Done, []string{"plan"}) {
		t.Errorf("journal %+v %v", j, ok)
	}
	if !slices.Equal(w.events, []string{"crash op/after-plan"}) {
		t.Errorf("events %q", w.events)
	}
}

// undoable is a step of w that records its run and its undo; run fails
// with err, the undo with undoErr (each when set).
func (w *world) undoable(name string, err error, undoErr *error) Step {
	s := w.step(name, err)
	s.Undo = func(context.Context) error {
		w.events = append(w.events, "undo "+name)
		if undoErr != nil {
			return *undoErr
		}
		return nil
	}
	return s
}

// runs keeps the "run" and "undo" events.
func runs(events []string) []string {
	return slices.DeleteFunc(slices.Clone(events), func(e string) bool {
		return !strings.HasPrefix(e, "run ") && !strings.HasPrefix(e, "undo ")
	})
}

func TestAFailedStepUndoesItselfAndTheStepsDoneInReverse(t *testing.T) {
	w := newWorld(t)
	boom := errors.New("boom")
	steps := []Step{w.undoable("a", nil, nil), w.step("check", nil), w.undoable("b", nil, nil), w.undoable("c", boom, nil), w.undoable("d", nil, nil)}
	err := w.runner().Run(context.Background(), steps)
	var rb *RolledBackError
	if !errors.Is(err, ErrRolledBack) || !errors.Is(err, boom) || !errors.As(err, &rb) || rb.Step != "c" {
		t.Fatalf("err %v, want a rollback of step c wrapping ErrRolledBack and the step's error", err)
	}
	if want := []string{"run a", "run check", "run b", "run c", "undo c", "undo b", "undo a"}; !slices.Equal(runs(w.events), want) {
		t.Errorf("runs %q, want %q", runs(w.events), want)
	}
	// The journal says it rolled back, and nothing of what it undid.
	j, ok := w.read(t)
	if !ok || !strings.Contains(j.RollingBack, "boom") || j.Failed != "" || !slices.Equal(j.Done, []string{"check"}) || j.Input != "in" {
		t.Errorf("journal after the rollback: %+v", j)
	}
	// A run after it goes on with the rollback (there is nothing left),
	// never forward.
	w.events = nil
	w2 := &world{p: w.p, j: j}
	err = w2.runner().Run(context.Background(), steps)
	if !errors.Is(err, ErrRolledBack) || len(runs(w2.events)) > 0 {
		t.Fatalf("rerun after the rollback: %v, %q: want it rolled back with nothing run", err, runs(w2.events))
	}
}

func TestAFailureWithNothingToUndoIsAPlainFailure(t *testing.T) {
	w := newWorld(t)
	err := w.runner().Run(context.Background(), []Step{w.step("a", nil), w.step("b", errors.New("boom"))})
	if errors.Is(err, ErrRolledBack) || !strings.Contains(err.Error(), "step b: boom") || w.j.RollingBack != "" {
		t.Fatalf("err %v, journal %+v: want step b's failure, no rollback", err, w.j)
	}
}

// A step whose error wraps ErrHold fails the run without a rollback
// although steps done have an undo; the next run does that step again.
func TestAHeldFailureIsNotRolledBackAndTheNextRunDoesTheStepAgain(t *testing.T) {
	w := newWorld(t)
	refused := errors.New("refused by the allocation fence")
	steps := []Step{w.undoable("a", nil, nil), w.undoable("b", Hold(refused), nil)}
	err := w.runner().Run(context.Background(), steps)
	if errors.Is(err, ErrRolledBack) || !errors.Is(err, refused) || !errors.Is(err, ErrHold) || w.j.RollingBack != "" || strings.Contains(err.Error(), "held") {
		t.Fatalf("err %v, journal %+v: want step b's failure with its own words, held, no rollback", err, w.j)
	}
	if want := []string{"run a", "run b"}; !slices.Equal(runs(w.events), want) {
		t.Errorf("runs %q, want %q", runs(w.events), want)
	}
	j, ok := w.read(t)
	if !ok || !slices.Equal(j.Done, []string{"a"}) {
		t.Fatalf("journal after the held failure: %+v (found %v), want a done", j, ok)
	}
	w2 := &world{p: w.p, j: j}
	if err := w2.runner().Run(context.Background(), []Step{w2.undoable("a", nil, nil), w2.undoable("b", nil, nil)}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"run b"}; !slices.Equal(runs(w2.events), want) {
		t.Errorf("the next run: %q, want %q", runs(w2.events), want)
	}
}

// A rollback cut at every one of its points (the journal says rolling
// back before the first undo, each undo journaled before its crash
// point) is finished by the next run: each step is undone, none twice
// after its undo was journaled, and no step runs forward again.
func TestARollbackCutAtEveryPointIsFinishedByTheNextRun(t *testing.T) {
	points := []string{CrashRollbackBegun("op"), CrashUndone("op", "c"), CrashUndone("op", "b"), CrashUndone("op", "a")}
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			w := newWorld(t)
			steps := []Step{w.undoable("a", nil, nil), w.undoable("b", nil, nil), w.undoable("c", errors.New("boom"), nil)}
			type cut struct{}
			r := w.runner()
			r.CrashPoint = func(name string) {
				if name == point {
					panic(cut{})
				}
			}
			func() {
				defer func() {
					if v := recover(); v != nil && v != (cut{}) {
						panic(v)
					}
				}()
				r.Run(context.Background(), steps)
				t.Fatalf("crash point %s not reached", point)
			}()
			undoneBefore := slices.Clone(runs(w.events))
			j, _ := w.read(t)
			w2 := &world{p: w.p, j: j}
			steps = []Step{w2.undoable("a", nil, nil), w2.undoable("b", nil, nil), w2.undoable("c", errors.New("boom"), nil)}
			if err := w2.runner().Run(context.Background(), steps); !errors.Is(err, ErrRolledBack) {
				t.Fatalf("the run after the cut: %v, want the rollback finished", err)
			}
			all := append(undoneBefore, runs(w2.events)...)
			for _, s := range []string{"a", "b", "c"} {
				if n := slices.Index(all, "undo "+s); n < 0 {
					t.Errorf("%s never undone: %q", s, all)
				}
			}
			for _, e := range runs(w2.events) {
				if strings.HasPrefix(e, "run ") {
					t.Errorf("the run after the cut ran %s forward: %q", e, all)
				}
			}
			// Only the step whose undo was cut before its journal may be
			// undone twice: here none (each crash point follows a write).
			seen := map[string]int{}
			for _, e := range all {
				seen[e]++
			}
			for e, n := range seen {
				if strings.HasPrefix(e, "undo ") && n > 1 {
					t.Errorf("%s %d times: %q", e, n, all)
				}
			}
		})
	}
}

func TestAnUndoThatFailsStopsTheRollbackUntilTheNextRun(t *testing.T) {
	w := newWorld(t)
	undoErr := errors.New("cannot undo")
	steps := []Step{w.undoable("a", nil, nil), w.undoable("b", nil, &undoErr), w.undoable("c", errors.New("boom"), nil)}
	err := w.runner().Run(context.Background(), steps)
	var ue *UndoError
	if !errors.As(err, &ue) || ue.Step != "b" || errors.Is(err, ErrRolledBack) || !errors.Is(err, undoErr) {
		t.Fatalf("err %v, want the undo of b failed, not rolled back", err)
	}
	if slices.Contains(runs(w.events), "undo a") {
		t.Errorf("a undone past the failed undo of b: %q", w.events)
	}
	j, _ := w.read(t)
	if j.RollingBack == "" || !strings.HasPrefix(j.Step, "b undo failed: cannot undo") || !slices.Equal(j.Done, []string{"a", "b"}) {
		t.Errorf("journal after the failed undo: %+v", j)
	}
	// The next run, the undo now working: b then a, nothing forward.
	undoErr = nil
	w2 := &world{p: w.p, j: j}
	var ok error
	steps = []Step{w2.undoable("a", nil, nil), w2.undoable("b", nil, &ok), w2.undoable("c", nil, nil)}
	if err := w2.runner().Run(context.Background(), steps); !errors.Is(err, ErrRolledBack) {
		t.Fatalf("the next run: %v", err)
	}
	if want := []string{"undo b", "undo a"}; !slices.Equal(runs(w2.events), want) {
		t.Errorf("the next run did %q, want %q", runs(w2.events), want)
	}
}

func TestRollBackUndoesTheStepsDoneOfAnUnfinishedRun(t *testing.T) {
	w := newWorld(t)
	w.j.Done = []string{"a", "b"}
	steps := []Step{w.undoable("a", nil, nil), w.undoable("b", nil, nil), w.undoable("c", nil, nil)}
	err := w.runner().RollBack(context.Background(), steps, "other arguments replace it")
	if !errors.Is(err, ErrRolledBack) || !strings.Contains(err.Error(), "other arguments replace it") {
		t.Fatalf("err %v", err)
	}
	if want := []string{"undo b", "undo a"}; !slices.Equal(runs(w.events), want) {
		t.Errorf("did %q, want %q", runs(w.events), want)
	}
}
