module unbounded-cloud.io/agent

go 1.26.0

require (
	golang.org/x/sys v0.50.0 // indirect
	k8s.io/api v0.36.3 // indirect
	k8s.io/apimachinery v0.36.3 // indirect
	k8s.io/client-go v0.36.3 // indirect
)
