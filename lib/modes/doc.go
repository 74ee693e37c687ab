// Package modes holds what the isolation modes share (ARCHITECTURE section
// 2): the operation set every mode implements (Mode, whose methods say what
// a caller runs around them: the fence, the applied record), what a slot is
// built from (Slot, SlotFromConfig), the service manager seam (Systemd),
// and `unbounded supports-isolation` (Host.Check). The modes are
// lib/modes/nspawn, lib/modes/container and lib/modes/none;
// lib/modes/nodestack renders the node stack's files for all of them,
// lib/modes/bluegreen is what the two blue/green modes share (the repave,
// the host network cleaning, and in lib/modes/bluegreen/tree the slot's
// tree). No error or log line of a mode holds the bootstrap token.
package modes
