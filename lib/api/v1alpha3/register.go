package v1alpha3

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of every type in this package.
const GroupName = "unbounded-cloud.io"

// Version is the API version of this package.
const Version = "v1alpha3"

// Resource names, as they appear in RBAC rules and REST paths.
const (
	ResourceMachines           = "machines"
	ResourceMachineOperations  = "machineoperations"
	ResourceMachineAllocations = "machineallocations"
	ResourceMachineRollouts    = "machinerollouts"
)

var (
	// SchemeGroupVersion is the group and version of this package.
	SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

	// SchemeBuilder registers this package's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this package's types to a scheme, for clients that
	// decode Machines, MachineOperations and MachineAllocations.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource qualifies a resource name (for example "machines") with this
// group, as API errors and RESTMappers expect.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&Machine{}, &MachineList{},
		&MachineOperation{}, &MachineOperationList{},
		&MachineAllocation{}, &MachineAllocationList{},
		&MachineRollout{}, &MachineRolloutList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
