// Package core names the VirtualMachineTemplate resource, as
// kubevirt.io/kubevirt/pkg/controller asks (stand-in, see ../../README.md).
package core

const (
	GroupName            = "template.kubevirt.io"
	SingularResourceName = "virtualmachinetemplate"
	PluralResourceName   = "virtualmachinetemplates"
)
