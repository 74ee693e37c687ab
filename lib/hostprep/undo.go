package hostprep

import (
	"context"
	"fmt"
	"os"
	"slices"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// Undo reverts every change of the host preparation record, newest first
// (unmask, swapon, restore files, previous sysctl values, unload the
// modules Prepare loaded), where the host still holds what Prepare set, and
// removes the record. Without a record it does nothing. What it cannot
// restore without overriding someone else (a value changed since, a module
// in use, a swap device gone) is left as is and returned as a leftover,
// with the reason, not an error: a reset must not fail over a module
// another program uses.
func (h *Host) Undo(ctx context.Context) (leftovers []string, err error) {
	rec, err := ReadRecord(h.Paths)
	if err != nil || rec == nil {
		return nil, err
	}
	leave := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		h.log().Warn("reset left a host preparation change as is", "what", msg)
		leftovers = append(leftovers, msg)
	}
	for i := len(rec.Changes) - 1; i >= 0; i-- {
		if err := ctx.Err(); err != nil {
			return leftovers, err
		}
		c := rec.Changes[i]
		if err := h.undo(ctx, c, leave); err != nil {
			return leftovers, fmt.Errorf("undo %s: %w", c, err)
		}
		h.crash("hostprep/after-undo")
	}
	if err := state.RemoveVerified(h.Paths.HostPrepRecord()); err != nil {
		return leftovers, err
	}
	return leftovers, nil
}

func (h *Host) undo(ctx context.Context, c Change, leave func(string, ...any)) error {
	switch c.Kind {
	case KindMask:
		file := h.unitFile(c.Name)
		if target, err := os.Readlink(file); err == nil && target == hostpaths.DevNullHost {
			if err := state.RemoveDurable(file); err != nil {
				return err
			}
		}
		h.removeDirs(c.CreatedDirs)
	case KindSwap:
		swaps, err := h.activeSwaps()
		if err != nil {
			return err
		}
		if slices.ContainsFunc(swaps, func(s Swap) bool { return s.Path == c.Name }) {
			return nil
		}
		if err := h.swapon(ctx, c.Name, c.Priority); err != nil {
			leave("swap %s stays off: %v", c.Name, err)
		}
	case KindFile:
		file := h.Paths.Join(c.Name)
		cur, err := os.ReadFile(file)
		switch {
		case os.IsNotExist(err):
		case err != nil:
			return err
		case string(cur) != c.Value:
			leave("%s changed since it was written; left as is", c.Name)
		case c.Previous != nil:
			if err := state.WriteFileAtomic(file, []byte(*c.Previous), 0o644); err != nil {
				return err
			}
		default:
			if err := state.RemoveDurable(file); err != nil {
				return err
			}
		}
		h.removeDirs(c.CreatedDirs)
	case KindSysctl:
		cur, err := h.readSysctl(c.Name)
		switch {
		case os.IsNotExist(err):
			// Gone with its module: nothing of ours is left.
		case err != nil:
			return err
		case c.Previous == nil:
		case cur != c.Value:
			if cur != *c.Previous {
				leave("sysctl %s is %s, changed since it was set to %s; left as is", c.Name, cur, c.Value)
			}
		default:
			if err := h.writeSysctl(c.Name, *c.Previous); err != nil {
				return err
			}
		}
	case KindModule:
		if module, _ := h.moduleLoaded(c.Name); module {
			if err := h.modprobe(ctx, "-r", c.Name); err != nil {
				leave("module %s stays loaded: %v", c.Name, err)
			}
		}
	default:
		leave("unknown change kind %q in the record", c.Kind)
	}
	return nil
}

// removeDirs removes the directories Prepare created, innermost first,
// when they are empty (another package may have put files there since).
func (h *Host) removeDirs(dirs []string) {
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(h.Paths.Join(dirs[i])); err != nil && !os.IsNotExist(err) {
			return
		}
	}
}
