package bootstrap

import (
	"context"
	"fmt"
	"time"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/readiness"
	"unbounded-cloud.io/agent/lib/sdstatus"
)

// ready waits, bounded, until the node stack of slot is up
// (lib/readiness): its units active, the kubelet's healthz ok, and its
// Node registered and Ready as the API server has it from the running
// kubelet, with the one node-stack restart for the kubelet's CSINode
// (readiness.CSINode) through m.
func (b *Bootstrap) ready(ctx context.Context, cfg *config.Config, slot string, m modes.Mode) error {
	timeout := b.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	interval := b.PollInterval
	if interval <= 0 {
		interval = 2 * time.Second
	}
	b.Status("phase %s: waiting (at most %s) for the node units, kubelet healthz and Node %s Ready", PhaseReady, timeout, cfg.Machine)
	probe := b.probe(cfg, m, slot)
	sd, err := b.Manager(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	chk := &readiness.Check{Units: sd, Mode: cfg.Mode, Slot: slot, Name: cfg.Machine, Healthz: probe.Healthz, Node: probe.Node,
		LocalDNS: cfg.Node.LocalDNS, DNSReady: probe.DNSReady}
	// The first looks come fast and back off to interval: the kubelet,
	// told its address, registers in its first second.
	w := readiness.Wait{Timeout: timeout, Poll: interval, FirstPoll: readiness.QuickPoll, Log: b.Logger(),
		Status: func(line string) { b.notifyOnly(fmt.Sprintf("STATUS=phase %s: %s", PhaseReady, line)) },
		CSINode: &readiness.CSINode{Grace: b.CSINodeGrace, AfterStart: b.CSINodeAfterStart,
			Restart: func(ctx context.Context) error { return m.Restart(ctx, slot) }},
	}
	if err := kube.NotUpExit(chk.Wait(ctx, w)); err != nil {
		return err
	}
	b.Logger().Info("node up", "node", cfg.Machine)
	return nil
}

func (b *Bootstrap) notifyOnly(state string) { sdstatus.Notify(b.Notify, state) }

func (b *Bootstrap) probe(cfg *config.Config, m modes.Mode, slot string) Probe {
	var p Probe
	if b.Probe != nil {
		p = b.Probe(cfg, cfg.Mode, slot)
	}
	if p.Node == nil {
		r := &kube.NodeReader{
			Name:     cfg.Machine,
			Server:   cfg.Cluster.APIServer,
			CAFile:   cfg.Resolve(cfg.Cluster.CAFile),
			CertFile: modes.KubeletCertFile(m, slot),
			Root:     m.NodeRoot(slot),
		}
		p.Node = r.Read
	}
	return p
}
