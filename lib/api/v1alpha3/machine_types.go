package v1alpha3

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IsolationMode is where a Machine's node stack runs (ARCHITECTURE section 2).
// +kubebuilder:validation:Enum=nspawn;container;none
type IsolationMode string

const (
	// IsolationNspawn runs the node stack in a systemd-nspawn machine; the default.
	IsolationNspawn IsolationMode = "nspawn"
	// IsolationContainer runs the node stack in an OCI container (experimental).
	IsolationContainer IsolationMode = "container"
	// IsolationNone runs the node stack on the host itself.
	IsolationNone IsolationMode = "none"
)

// IsolationModes lists every mode, in the order the documentation gives them.
var IsolationModes = []IsolationMode{IsolationNspawn, IsolationContainer, IsolationNone}

// Slot names one of the two node-stack slots; exactly one is active.
// +kubebuilder:validation:Enum=kube1;kube2
type Slot string

const (
	SlotKube1 Slot = "kube1"
	SlotKube2 Slot = "kube2"
)

// MachinePhase is the one-word summary of a Machine shown by `kubectl get
// machines`. Conditions carry the detail; the phase is for people. Only
// the phases the agent sets are declared: a repave and an agent upgrade
// show in their MachineOperation (and the upgrade in AgentUpgraded), not
// in the phase.
// +kubebuilder:validation:Enum=Pending;Bootstrapping;Ready;ChangingIsolation;Refused;Failed
type MachinePhase string

const (
	// MachinePending: the Machine exists but no agent has reported yet;
	// also after the allocation fence allowed a node it had refused.
	MachinePending MachinePhase = "Pending"
	// MachineBootstrapping: the first bootstrap runs on the host.
	MachineBootstrapping MachinePhase = "Bootstrapping"
	// MachineReady: the node stack of the active slot is up.
	MachineReady MachinePhase = "Ready"
	// MachineChangingIsolation: an isolation change (in place or by
	// reprovision) runs; status.isolationChange has the detail.
	MachineChangingIsolation MachinePhase = "ChangingIsolation"
	// MachineRefused: the allocation fence refused to start the node stack
	// (condition AllocationLaunchRefused).
	MachineRefused MachinePhase = "Refused"
	// MachineFailed: the first bootstrap failed (status.bootstrap has
	// the reason).
	MachineFailed MachinePhase = "Failed"
)

// Condition types set on a Machine: every one the agent sets, and no
// other. Each is a metav1.Condition in status.conditions; True means what
// the name says happened or holds. (Whether the node is up is the Node's
// Ready condition; a repave's outcome is its MachineOperation's.)
const (
	// ConditionBootstrapped is True once the first bootstrap brought the node up.
	ConditionBootstrapped = "Bootstrapped"
	// ConditionAllocationLaunchRefused is True while the allocation fence
	// keeps the node stack down (exit 77 of unbounded-fence).
	ConditionAllocationLaunchRefused = "AllocationLaunchRefused"
	// ConditionAgentUpgraded reports the outcome of the last agent self-upgrade.
	ConditionAgentUpgraded = "AgentUpgraded"
	// ConditionIsolationChanged reports the outcome of the last isolation change.
	ConditionIsolationChanged = "IsolationChanged"
	// ConditionRecovered reports the last run of recovery (a failed agent
	// unit, or state the generator found unusable at boot): True when it
	// repaired what the failure needed, False when it could not or held
	// back, Unknown when an installation owned the host.
	ConditionRecovered = "Recovered"
)

// Reasons for ConditionAllocationLaunchRefused, so that the fence and whoever
// reads the condition agree on the spelling.
const (
	// ReasonAllocationFenced: spec.allocation.fenced is true.
	ReasonAllocationFenced = "AllocationFenced"
	// ReasonAllocationMismatch: the Machine binds another allocation UID.
	ReasonAllocationMismatch = "AllocationMismatch"
	// ReasonMachineDeleting: the Machine has a deletion timestamp.
	ReasonMachineDeleting = "MachineDeleting"
	// ReasonBootstrapTokenRejected: the bootstrap token no longer authenticates.
	ReasonBootstrapTokenRejected = "BootstrapTokenRejected"
	// ReasonForbidden: the cluster answered 403 to the fence's read.
	ReasonForbidden = "Forbidden"
	// ReasonCertificateRejected: the API server answered 401 to the fence's
	// read with the client certificate (revoked CA, wrong signer). The
	// fence records it with the bootstrap token when that still may write.
	ReasonCertificateRejected = "CertificateRejected"
	// ReasonClusterUnreachable: no answer within the fence's retry budget.
	ReasonClusterUnreachable = "ClusterUnreachable"
	// ReasonAllowed is used when the fence clears the condition.
	ReasonAllowed = "Allowed"
)

// Machine is one host that the agent turns into a Kubernetes worker node.
//
// Every agent may read every Machine (lib/api/manifests: reads are not
// narrowed to the caller's own), so nothing in a Machine may be secret: it
// names Secrets, never holds them.
//
// Its name is embedded in the agent's identities (bootstrap group, certificate
// user, RBAC role names), whose syntax allows no dot; so the name is an
// RFC 1123 label, checked here and by ValidateMachineName.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=um,categories=unbounded
// +kubebuilder:subresource:status
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="a Machine name must be an RFC 1123 label (lower-case letters, digits and '-', at most 63 characters): it is embedded in the agent's bootstrap group, which allows no dot"
// +kubebuilder:printcolumn:name="MODE",type=string,JSONPath=`.status.isolation.mode`,description="Isolation mode the node stack runs in"
// +kubebuilder:printcolumn:name="SLOT",type=string,JSONPath=`.status.isolation.slot`,description="Active node-stack slot"
// +kubebuilder:printcolumn:name="PHASE",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="AGENT",type=string,JSONPath=`.status.agent.version`,description="Agent version running on the host"
// +kubebuilder:printcolumn:name="NODE",type=string,JSONPath=`.status.nodeName`,priority=1
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`
type Machine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec MachineSpec `json:"spec,omitempty"`
	// +optional
	Status MachineStatus `json:"status,omitempty"`
}

// MachineSpec is what the cluster wants the host to run. A change of
// agent means an upgrade; a change of isolation.mode means an isolation
// change (by isolation.method, when set).
type MachineSpec struct {
	// Kubernetes describes the node the host joins as.
	// +optional
	Kubernetes KubernetesSpec `json:"kubernetes,omitempty"`
	// Agent is the agent build the host should run.
	// +optional
	Agent *AgentSpec `json:"agent,omitempty"`
	// Isolation says where the node stack runs.
	// +optional
	Isolation IsolationSpec `json:"isolation,omitempty"`
	// Allocation binds the Machine to the MachineAllocation the host was
	// launched for; the allocation fence checks it before every node start.
	// +optional
	Allocation *AllocationRef `json:"allocation,omitempty"`
}

// KubernetesSpec describes the node.
type KubernetesSpec struct {
	// Version of the node stack (kubelet), e.g. "1.36.3" (a leading "v" is accepted).
	// +kubebuilder:validation:Pattern=`^v?[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$`
	// +optional
	Version string `json:"version,omitempty"`
	// NodeLabels are set on the Node at registration.
	// +optional
	NodeLabels map[string]string `json:"nodeLabels,omitempty"`
	// Taints are set on the Node at registration.
	// +optional
	// +listType=atomic
	Taints []corev1.Taint `json:"taints,omitempty"`
	// BootstrapTokenRef names the bootstrap token Secret (normally in
	// kube-system) the host was given. Revoking the allocation deletes it.
	// The name carries the token id, the public half of the token; the
	// secret half stays in the Secret, which no agent may read.
	// +optional
	BootstrapTokenRef *SecretRef `json:"bootstrapTokenRef,omitempty"`
}

// SecretRef names a Secret.
type SecretRef struct {
	// +kubebuilder:validation:MinLength=1
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// AgentSpec is an agent build: a change of any field means an upgrade.
type AgentSpec struct {
	// Version of the agent, e.g. "0.4.1".
	// +kubebuilder:validation:MinLength=1
	Version string `json:"version"`
	// URL the package is downloaded from: https, with a host (the
	// upgrade fetches nothing else: the SHA-256 says what the package is,
	// https who sent it), trusted by the host's system roots or the
	// cluster CA. Without it (or without SHA256) the host does not
	// upgrade. Every agent can read it: it must not carry a credential
	// (no user:password@, no signed query string).
	// +kubebuilder:validation:XValidation:rule="self.matches('^(?i)https://[^/?#@]')",message="the URL must be https://HOST/...: the agent fetches its package over https only"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[^/?#]*://[^/?#]*@')",message="the URL must not carry credentials (user:password@): every agent can read every Machine"
	// +optional
	URL string `json:"url,omitempty"`
	// SHA256 of the package, lower-case hex.
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	// +optional
	SHA256 string `json:"sha256,omitempty"`
}

// IsolationSpec says where the node stack runs.
type IsolationSpec struct {
	// Mode is the isolation mode; nspawn when unset.
	// +kubebuilder:default=nspawn
	// +optional
	Mode IsolationMode `json:"mode,omitempty"`
	// Method is how a change of mode is carried out: InPlace (the new
	// mode built beside the old one) or Reprovision (the host reset and
	// bootstrapped again in the new mode). Unset: the build's method for
	// the pair of modes (lib/modes/change.go). It is read when the daemon
	// asks for a change: of the mode, or a failed change asked again at a
	// later generation; a node already in the spec's mode is not changed
	// again for it. A method the host's build does not carry out for the
	// pair is reported Failed, with the node left as it is.
	// +optional
	Method IsolationChangeMethod `json:"method,omitempty"`
}

// AllocationRef binds a Machine to a MachineAllocation.
type AllocationRef struct {
	// Name of the MachineAllocation.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// UID of the MachineAllocation (its metadata.uid). The host carries the
	// same value in its config; the fence refuses when they differ.
	// +optional
	UID string `json:"uid,omitempty"`
	// Fenced revokes the allocation: the node stack must not start.
	// +optional
	Fenced bool `json:"fenced,omitempty"`
}

// MachineStatus is what the agent reports.
type MachineStatus struct {
	// Phase is a one-word summary; conditions carry the detail.
	// +optional
	Phase MachinePhase `json:"phase,omitempty"`
	// ObservedGeneration is the spec generation the agent last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
	// Agent is the agent running on the host.
	// +optional
	Agent *AgentStatus `json:"agent,omitempty"`
	// Isolation is where the node stack runs now.
	// +optional
	Isolation *IsolationStatus `json:"isolation,omitempty"`
	// IsolationChange is the last (or running) isolation change.
	// +optional
	IsolationChange *IsolationChangeStatus `json:"isolationChange,omitempty"`
	// Bootstrap is the first bootstrap's progress, reported best effort.
	// +optional
	Bootstrap *BootstrapStatus `json:"bootstrap,omitempty"`
	// NodeName is the name of the Node the host registered as.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
}

// AgentStatus is the agent running on the host.
type AgentStatus struct {
	// +optional
	Version string `json:"version,omitempty"`
}

// IsolationStatus is the running isolation mode and active slot.
type IsolationStatus struct {
	// +optional
	Mode IsolationMode `json:"mode,omitempty"`
	// Slot is the active slot; empty in mode none, which has no slots.
	// +optional
	Slot Slot `json:"slot,omitempty"`
}

// IsolationChangeMethod is how an isolation change is carried out.
// +kubebuilder:validation:Enum=InPlace;Reprovision
type IsolationChangeMethod string

const (
	// IsolationChangeInPlace: both modes can share the host; the new one is
	// built beside the old.
	IsolationChangeInPlace IsolationChangeMethod = "InPlace"
	// IsolationChangeReprovision: the host is reset and bootstrapped again.
	IsolationChangeReprovision IsolationChangeMethod = "Reprovision"
)

// IsolationChangeState is the progress of an isolation change.
// +kubebuilder:validation:Enum=InProgress;Succeeded;Failed
type IsolationChangeState string

const (
	IsolationChangeInProgress IsolationChangeState = "InProgress"
	IsolationChangeSucceeded  IsolationChangeState = "Succeeded"
	IsolationChangeFailed     IsolationChangeState = "Failed"
)

// IsolationChangeStatus is the last (or running) change of isolation mode.
type IsolationChangeStatus struct {
	From IsolationMode `json:"from"`
	To   IsolationMode `json:"to"`
	// +optional
	Method IsolationChangeMethod `json:"method,omitempty"`
	State  IsolationChangeState  `json:"state"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// BootstrapState is the progress of the first bootstrap.
// +kubebuilder:validation:Enum=Running;Succeeded;Failed
type BootstrapState string

const (
	BootstrapRunning   BootstrapState = "Running"
	BootstrapSucceeded BootstrapState = "Succeeded"
	BootstrapFailed    BootstrapState = "Failed"
)

// BootstrapStatus is the first bootstrap's progress, reported best effort by
// unbounded-bootstrap.
type BootstrapStatus struct {
	State BootstrapState `json:"state"`
	// Reason is a CamelCase word for a failure (for example ArtifactDownloadFailed).
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// Time of the last state change.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
}

// MachineList is a list of Machines.
// +kubebuilder:object:root=true
type MachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Machine `json:"items"`
}
