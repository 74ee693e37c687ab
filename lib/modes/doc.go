// Package modes holds what the isolation modes share (ARCHITECTURE section
// 2): the operation set every mode implements (Mode, whose methods say what
// a caller runs around them: the fence, the applied record), what a slot is
// built from (Slot, SlotFromConfig), the service manager seam (Systemd),
// and `unbounded supports-isolation` (Host.Check). The modes are
// lib/modes/nspawn and lib/modes/none; lib/modes/nodestack renders the node
// stack's files for both. No error or log line of a mode holds the
// bootstrap token.
package modes
