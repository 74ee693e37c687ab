package v1alpha3

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// RolloutLabel labels every MachineOperation a MachineRollout created
// with the rollout's name.
const RolloutLabel = GroupName + "/rollout"

// MachineRollout rolls one operation over the Machines its selector picks,
// run by the cluster (unbounded-controller), not by a workstation: at most
// maxUnavailable hosts at once (and per topology), only inside its
// maintenance window, each host done once its Node has been Ready for the
// health gate after its operation, stopping after failureThreshold failed
// hosts. It creates the same MachineOperations an operator can create
// (labelled RolloutLabel), never a second one for a host that has one in
// flight, from this rollout or any other. A changed spec (a fixed image,
// a new version) retries the hosts that failed.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=umr,categories=unbounded
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="OPERATION",type=string,JSONPath=`.spec.operation`
// +kubebuilder:printcolumn:name="PHASE",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="DONE",type=integer,JSONPath=`.status.done`
// +kubebuilder:printcolumn:name="FAILED",type=integer,JSONPath=`.status.failed`
// +kubebuilder:printcolumn:name="TOTAL",type=integer,JSONPath=`.status.total`
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineRollout struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec MachineRolloutSpec `json:"spec"`
	// +optional
	Status MachineRolloutStatus `json:"status,omitempty"`
}

// MachineRolloutSpec is what to roll, over which hosts, how fast and when.
// +kubebuilder:validation:XValidation:rule="self.operation != 'AgentUpgrade' || (has(self.parameters) && 'version' in self.parameters && 'url' in self.parameters && 'sha256' in self.parameters && self.parameters['sha256'].matches('^[0-9a-f]{64}$') && self.parameters['url'].matches('^(https://[^/?#@]+([/?#].*)?|file:///.+)$'))",message="an AgentUpgrade rollout needs parameters version, url (https://HOST/... without credentials, or file:///PATH on the hosts) and sha256 (64 lower-case hex digits)"
// +kubebuilder:validation:XValidation:rule="has(self.selector) != has(self.machines)",message="name the hosts by selector or by machines, one of the two"
type MachineRolloutSpec struct {
	// Selector picks the Machines by their labels (taken in name order),
	// once, when the rollout first acts: a Machine labelled later is not
	// added. Either selector or machines.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	// Machines names the hosts, taken in this order (what `kubectl
	// unbounded repave M1 M2` names). Either selector or machines; a
	// Machine that does not exist when the rollout first acts makes its
	// spec invalid: nothing starts.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=10000
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Machines []string `json:"machines,omitempty"`
	// Operation is what each host does.
	Operation OperationType `json:"operation"`
	// Parameters are the operation's, as a MachineOperation's (an
	// AgentUpgrade's version, url and sha256; a Repave's force,
	// drainTimeout, deleteUnmanaged).
	// +optional
	Parameters map[string]string `json:"parameters,omitempty"`
	// MaxUnavailable is how many hosts may be unavailable at once (their
	// operation runs or their health gate has not passed): a count, or a
	// percentage of the selected hosts rounded down but at least one.
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:default=1
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// Topology limits the unavailable hosts per value of a Node label too.
	// +optional
	Topology *TopologyLimit `json:"topology,omitempty"`
	// Window is when a host's operation may start; outside it, operations
	// that run go on and nothing new starts.
	// +optional
	Window *MaintenanceWindow `json:"window,omitempty"`
	// ReadySeconds is the health gate: a host is done once its Node has
	// been Ready for this long, written after its operation started, and
	// no recovery reported a failure since.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=30
	// +optional
	ReadySeconds int32 `json:"readySeconds,omitempty"`
	// Paused: no new operation starts; the running ones are followed.
	// +optional
	Paused bool `json:"paused,omitempty"`
	// FailureThreshold stops the rollout once this many hosts failed (at
	// the spec's current generation), leaving the rest untouched.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=1
	// +optional
	FailureThreshold int32 `json:"failureThreshold,omitempty"`
}

// TopologyLimit is a per-topology budget.
type TopologyLimit struct {
	// Key is the Node label that names the topology (for example
	// topology.kubernetes.io/zone); hosts without it share one domain.
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
	// MaxUnavailable per value of Key: a count, or a percentage of that
	// value's hosts rounded down but at least one.
	// +kubebuilder:validation:XIntOrString
	MaxUnavailable intstr.IntOrString `json:"maxUnavailable"`
}

// Weekday is a day of the week, as a window names it.
// +kubebuilder:validation:Enum=Mon;Tue;Wed;Thu;Fri;Sat;Sun
type Weekday string

// MaintenanceWindow is a daily time range in a named time zone.
type MaintenanceWindow struct {
	// Days on which the window opens (it may close the next day); empty:
	// every day.
	// +optional
	Days []Weekday `json:"days,omitempty"`
	// Start and End are wall-clock times, HH:MM; an End not after Start
	// closes the window the next day (across midnight).
	// +kubebuilder:validation:Pattern=`^([01][0-9]|2[0-3]):[0-5][0-9]$`
	Start string `json:"start"`
	// +kubebuilder:validation:Pattern=`^([01][0-9]|2[0-3]):[0-5][0-9]$`
	End string `json:"end"`
	// TimeZone is an IANA name (Europe/Berlin); empty: UTC.
	// +optional
	TimeZone string `json:"timeZone,omitempty"`
}

// RolloutPhase is where a rollout stands.
// +kubebuilder:validation:Enum=Progressing;Paused;OutsideWindow;Stopped;Complete
type RolloutPhase string

const (
	RolloutProgressing   RolloutPhase = "Progressing"
	RolloutPaused        RolloutPhase = "Paused"
	RolloutOutsideWindow RolloutPhase = "OutsideWindow"
	// RolloutStopped: failureThreshold hosts failed; a changed spec
	// retries them.
	RolloutStopped  RolloutPhase = "Stopped"
	RolloutComplete RolloutPhase = "Complete"
)

// HostState is where one host of a rollout stands.
// +kubebuilder:validation:Enum=Pending;InProgress;Verifying;Done;Failed
type HostState string

const (
	HostPending    HostState = "Pending"
	HostInProgress HostState = "InProgress"
	// HostVerifying: the operation completed, the health gate has not
	// passed yet.
	HostVerifying HostState = "Verifying"
	HostDone      HostState = "Done"
	HostFailed    HostState = "Failed"
)

// Unavailable: the host counts against the budgets.
func (s HostState) Unavailable() bool { return s == HostInProgress || s == HostVerifying }

// RolloutHost is one selected host's state.
type RolloutHost struct {
	// Name is the Machine's.
	Name  string    `json:"name"`
	State HostState `json:"state"`
	// Operation is the name of the host's latest MachineOperation of
	// this rollout.
	// +optional
	Operation string `json:"operation,omitempty"`
	// Attempt counts this rollout's operations for the host (a changed
	// spec retries a failed host).
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// Generation is the rollout's generation the latest operation was
	// created for.
	// +optional
	Generation int64 `json:"generation,omitempty"`
	// Message says why the host waits or failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// MachineRolloutStatus is the rollout's progress, written by
// unbounded-controller.
type MachineRolloutStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	Phase RolloutPhase `json:"phase,omitempty"`
	// Hosts are the selected hosts, by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	Hosts []RolloutHost `json:"hosts,omitempty"`
	// +optional
	Total int32 `json:"total,omitempty"`
	// +optional
	Done int32 `json:"done,omitempty"`
	// +optional
	Unavailable int32 `json:"unavailable,omitempty"`
	// +optional
	Failed int32 `json:"failed,omitempty"`
	// NextActionTime is when the rollout will look again without being
	// woken (a health gate's end, the window's opening).
	// +optional
	NextActionTime *metav1.Time `json:"nextActionTime,omitempty"`
	// Message says what the rollout waits for, or why it stopped.
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachineRolloutList is a list of MachineRollouts.
// +kubebuilder:object:root=true
type MachineRolloutList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineRollout `json:"items"`
}
