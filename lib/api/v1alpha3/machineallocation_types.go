package v1alpha3

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachineAllocation binds a Machine to a consumer. The Machine it binds
// carries the allocation's name and metadata.uid in spec.allocation; the
// host launched for it carries the same UID in its config. Fencing the
// allocation (spec.fenced) is mirrored by the controller into the Machine and
// revokes the bootstrap token of the host launched for it.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=uma,categories=unbounded
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="MACHINE",type=string,JSONPath=`.spec.machineRef.name`
// +kubebuilder:printcolumn:name="CONSUMER",type=string,JSONPath=`.spec.consumer`
// +kubebuilder:printcolumn:name="FENCED",type=boolean,JSONPath=`.spec.fenced`
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineAllocation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec MachineAllocationSpec `json:"spec"`
	// +optional
	Status MachineAllocationStatus `json:"status,omitempty"`
}

// MachineAllocationSpec binds one Machine to one consumer.
type MachineAllocationSpec struct {
	// MachineRef names the bound Machine. It cannot change: a new binding is
	// a new allocation, with a new UID.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="machineRef is immutable"
	MachineRef MachineRef `json:"machineRef"`
	// Consumer names who the Machine is allocated to (free form, for example
	// a tenant or a cluster name).
	// +kubebuilder:validation:MinLength=1
	Consumer string `json:"consumer"`
	// Fenced revokes the allocation.
	// +optional
	Fenced bool `json:"fenced,omitempty"`
}

// MachineAllocationStatus is kept minimal: the cluster-side controller owns it.
type MachineAllocationStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachineAllocationList is a list of MachineAllocations.
// +kubebuilder:object:root=true
type MachineAllocationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineAllocation `json:"items"`
}
