package v1alpha3

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachineLabel is the label key that carries, on a MachineOperation, the name
// of the Machine it targets. The daemon watches with a label selector on it,
// so that it only receives its own operations. Whoever creates an operation
// must set it equal to spec.machineRef.name; the admission policy shipped in
// lib/api/manifests rejects an operation where the two differ.
const MachineLabel = GroupName + "/machine"

// OperationType is what a MachineOperation asks the agent to do.
// +kubebuilder:validation:Enum=Repave;Restart;Reboot;AgentUpgrade
type OperationType string

const (
	// OperationRepave starts unbounded-repave.service.
	OperationRepave OperationType = "Repave"
	// OperationRestart starts unbounded-restart.service (a soft reboot of the
	// node stack, never the host).
	OperationRestart OperationType = "Restart"
	// OperationReboot reboots the host through systemd, after the operation
	// is marked InProgress.
	OperationReboot OperationType = "Reboot"
	// OperationAgentUpgrade starts the agent's self-upgrade.
	OperationAgentUpgrade OperationType = "AgentUpgrade"
)

// OperationState is the progress of a MachineOperation.
// +kubebuilder:validation:Enum=Pending;InProgress;Complete;Failed
type OperationState string

const (
	OperationPending    OperationState = "Pending"
	OperationInProgress OperationState = "InProgress"
	OperationComplete   OperationState = "Complete"
	OperationFailed     OperationState = "Failed"
)

// Finished reports whether s is a final state (Complete or Failed): an
// operation in a final state is never dispatched again.
func (s OperationState) Finished() bool {
	return s == OperationComplete || s == OperationFailed
}

// MachineOperation asks the agent on one Machine to do one thing once.
// Its spec cannot change after creation: an operation that is already
// running cannot be turned into another one; create a new operation instead.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=umo,categories=unbounded
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="MACHINE",type=string,JSONPath=`.spec.machineRef.name`
// +kubebuilder:printcolumn:name="OPERATION",type=string,JSONPath=`.spec.operation`
// +kubebuilder:printcolumn:name="STATE",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="REASON",type=string,JSONPath=`.status.reason`,priority=1
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineOperation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec MachineOperationSpec `json:"spec"`
	// +optional
	Status MachineOperationStatus `json:"status,omitempty"`
}

// MachineOperationSpec is the request.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: create a new MachineOperation instead"
type MachineOperationSpec struct {
	// MachineRef names the target Machine.
	MachineRef MachineRef `json:"machineRef"`
	// Operation is what to do.
	Operation OperationType `json:"operation"`
	// Parameters are operation-specific (for example the agent version of
	// an AgentUpgrade). Never secrets: every agent can read every operation.
	// +optional
	Parameters map[string]string `json:"parameters,omitempty"`
}

// MachineRef names a Machine.
type MachineRef struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
}

// MachineOperationStatus is the progress the agent reports.
type MachineOperationStatus struct {
	// State is Pending until the agent picks the operation up.
	// +optional
	State OperationState `json:"state,omitempty"`
	// Reason is a CamelCase word for the outcome (for example UnitFailed).
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message is for people: for a failure, the unit's result and its last
	// journal lines. Every agent can read it; a unit must not log secrets.
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// MachineOperationList is a list of MachineOperations.
// +kubebuilder:object:root=true
type MachineOperationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineOperation `json:"items"`
}
