// Package modes holds what the isolation modes share (ARCHITECTURE
// section 2): the operation set every mode implements (Mode), what a slot
// is built from (Slot, Node, Artifacts, Image), the service manager seam
// (Systemd), and `unbounded supports-isolation` (Host.Check).
//
// The modes are lib/modes/nspawn and lib/modes/none; lib/modes/nodestack
// renders the node stack's files for both, lib/units is systemd
// over D-Bus. An integrator (bootstrap, reset) does:
//
//	var m modes.Mode = &nspawn.Mode{}                   // or &none.Mode{}: zero value = real host
//	a, err := modes.ArtifactsByName(files)              // name -> Result.File of lib/artifacts' FetchAll
//	slot, err := modes.SlotFromConfig(cfg, "kube1", a)
//	err = m.Prepare(ctx, slot)                          // build the slot on disk, atomically
//	err = m.Start(ctx, "kube1")                         // daemon-reload + start the supervising unit(s)
//	...                                                 // (run the fence before; start unbounded-node.target after the record)
//	err = m.Destroy(ctx, "kube1")                       // reset: stop, remove, verify gone
//
// Errors: modes.ErrSlotActive (Prepare of a running slot: Destroy first),
// modes.ErrNotImplemented (an operation a mode does not carry yet: exit 1),
// modes.ErrRolledBack (wrapped by a Repave that failed and rolled back),
// exitcode.ErrTemporary wrapped for a registry that may answer later
// (exit 75), exitcode.ErrConfigInvalid for a missing nspawn.image (exit
// 78); everything else is exit 1. No error or log line holds the bootstrap
// token.
package modes
