package kube_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/kube"
)

// Readiness is every reader's view of a Node: absent, present without a
// Ready condition yet, and Ready or not with the condition's fields.
func TestReadinessOfANode(t *testing.T) {
	if st := kube.Readiness(nil); !st.Known || st.Present || st.Ready {
		t.Errorf("no Node: %+v, want known and absent", st)
	}
	n := &corev1.Node{}
	if st := kube.Readiness(n); !st.Present || st.Ready || st.Status != "" {
		t.Errorf("no Ready condition: %+v, want present, not Ready, no status", st)
	}
	hb := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	n.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionTrue},
		{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "CNI",
			LastHeartbeatTime: metav1.NewTime(hb), LastTransitionTime: metav1.NewTime(hb.Add(-time.Minute))},
	}
	st := kube.Readiness(n)
	if st.Ready || st.Status != "False" || st.Reason != "KubeletNotReady" || st.Message != "CNI" || !st.Heartbeat.Equal(hb) || !st.Transition.Equal(hb.Add(-time.Minute)) {
		t.Errorf("Ready=False: %+v", st)
	}
	n.Status.Conditions[1].Status = corev1.ConditionTrue
	if st := kube.Readiness(n); !st.Ready || st.Status != "True" {
		t.Errorf("Ready=True: %+v", st)
	}
}
