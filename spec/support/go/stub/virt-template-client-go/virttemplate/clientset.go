// Package virttemplate: the constructor kubevirt.io/kubevirt/pkg/controller
// names. It always fails: hotplug-oracle never builds a template informer
// (stand-in, see ../../README.md).
package virttemplate

import (
	"errors"

	"k8s.io/client-go/rest"
)

type TemplateV1beta1Interface interface {
	RESTClient() rest.Interface
}

type Clientset struct{}

func (*Clientset) TemplateV1beta1() TemplateV1beta1Interface { return nil }

func NewForConfig(*rest.Config) (*Clientset, error) {
	return nil, errors.New("virt-template-client-go stand-in: no VirtualMachineTemplate client in test tooling")
}
