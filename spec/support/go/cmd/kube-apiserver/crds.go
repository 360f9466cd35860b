package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	virtv1 "kubevirt.io/api/core/v1"
)

// realCRDs are KubeVirt's VirtualMachine, VirtualMachineInstance and KubeVirt
// definitions, followed by those read from --crd files (Flux's HelmRelease).
//
// KubeVirt's virt-operator builds its CRDs in pkg/virt-operator/resource/
// generate/components, which cannot be compiled here: it imports
// kubevirt.io/virt-template-api, which the Go module proxy does not serve.
// So the definitions are made as that package makes them (names, versions
// from kubevirt.io/api's ApiSupportedVersions, scope, the status subresource
// on VirtualMachine and KubeVirt but not on VirtualMachineInstance), and the
// OpenAPI schema of each is read, unchanged, from the generated Go source of
// that package in KubeVirt's module (validations_generated.go), as
// patchValidation there reads it.
func realCRDs(kubevirtSource string, files []string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	if kubevirtSource == "" {
		return nil, fmt.Errorf("--kubevirt-source is required")
	}
	schemas, err := kubevirtSchemas(filepath.Join(kubevirtSource, "pkg/virt-operator/resource/generate/components/validations_generated.go"))
	if err != nil {
		return nil, err
	}
	type def struct {
		gvk        schema.GroupVersionKind
		plural     string
		singular   string
		shortNames []string
		status     bool
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, d := range []def{
		{virtv1.VirtualMachineGroupVersionKind, "virtualmachines", "virtualmachine", []string{"vm", "vms"}, true},
		{virtv1.VirtualMachineInstanceGroupVersionKind, "virtualmachineinstances", "virtualmachineinstance", []string{"vmi", "vmis"}, false},
		{virtv1.KubeVirtGroupVersionKind, "kubevirts", "kubevirt", []string{"kv", "kvs"}, true},
	} {
		text, ok := schemas[d.singular]
		if !ok {
			return nil, fmt.Errorf("KubeVirt's generated validations have no schema for %q", d.singular)
		}
		validation := &apiextensionsv1.CustomResourceValidation{}
		if err := utilyaml.NewYAMLToJSONDecoder(strings.NewReader(text)).Decode(validation); err != nil {
			return nil, fmt.Errorf("KubeVirt's schema for %s: %w", d.singular, err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		crd.APIVersion, crd.Kind = "apiextensions.k8s.io/v1", "CustomResourceDefinition"
		crd.Name = d.plural + "." + d.gvk.Group
		crd.Spec = apiextensionsv1.CustomResourceDefinitionSpec{
			Group: d.gvk.Group,
			Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: d.plural, Singular: d.singular, Kind: d.gvk.Kind,
				ShortNames: d.shortNames, Categories: []string{"all"},
			},
		}
		for _, v := range virtv1.ApiSupportedVersions {
			v = *v.DeepCopy()
			v.Schema = validation.DeepCopy()
			if d.status {
				v.Subresources = &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}
			}
			crd.Spec.Versions = append(crd.Spec.Versions, v)
		}
		crds = append(crds, crd)
	}
	for _, f := range files {
		read, err := readCRDFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		crds = append(crds, read...)
	}
	return crds, nil
}

// kubevirtSchemas reads the CRDsValidation map literal of KubeVirt's
// generated source: singular name -> the YAML of its openAPIV3Schema.
func kubevirtSchemas(path string) (map[string]string, error) {
	file, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	ast.Inspect(file, func(n ast.Node) bool {
		kv, ok := n.(*ast.KeyValueExpr)
		if !ok {
			return true
		}
		key, ok1 := kv.Key.(*ast.BasicLit)
		val, ok2 := kv.Value.(*ast.BasicLit)
		if ok1 && ok2 && key.Kind == token.STRING && val.Kind == token.STRING {
			k, err1 := strconv.Unquote(key.Value)
			v, err2 := strconv.Unquote(val.Value)
			if err1 == nil && err2 == nil {
				out[k] = v
			}
		}
		return true
	})
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no CRDsValidation entries found", path)
	}
	return out, nil
}

func readCRDFile(path string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := dec.Decode(crd); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, err
		}
		if crd.Name == "" {
			continue
		}
		if crd.Kind != "CustomResourceDefinition" {
			return nil, fmt.Errorf("%s is a %s, not a CustomResourceDefinition", crd.Name, crd.Kind)
		}
		crds = append(crds, crd)
	}
	return crds, nil
}

// installCRDs creates the real CRDs and waits until each is Established and
// its resource answers a list, so that no fixture or spec meets a 404.
func installCRDs(ctx context.Context, cp *controlPlane, files []string) error {
	crds, err := realCRDs(cp.kubevirtSource, files)
	if err != nil {
		return err
	}
	cp.realCRDs = map[string]bool{}
	cp.realCRDList = crds
	return cp.createCRDs(ctx, crds)
}

// createCRDs creates CRDs (an existing one is left as it is) and waits until
// each is served.
func (cp *controlPlane) createCRDs(ctx context.Context, crds []*apiextensionsv1.CustomResourceDefinition) error {
	for _, crd := range crds {
		crd = crd.DeepCopy()
		crd.ResourceVersion = ""
		if _, err := cp.ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: %w", crd.Name, err)
		}
		cp.realCRDs[crd.Name] = true
	}
	for _, crd := range crds {
		if err := cp.waitServed(ctx, crd.Name); err != nil {
			return err
		}
	}
	return nil
}

// waitServed waits for a CRD's Established condition and for its storage
// version's resource to answer a list.
func (cp *controlPlane) waitServed(ctx context.Context, name string) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		crd, err := cp.ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		established := false
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				established = true
			}
			if c.Type == apiextensionsv1.NamesAccepted && c.Status == apiextensionsv1.ConditionFalse {
				return false, fmt.Errorf("CRD %s: names not accepted: %s", name, c.Message)
			}
		}
		if !established {
			return false, nil
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: crd.Spec.Names.Plural}
			if _, err := cp.dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
				return false, nil
			}
		}
		return true, nil
	})
}

// restoreRealCRDs re-creates the real CRDs a spec deleted (to play a cluster
// without KubeVirt or Flux), so that a reset brings them back.
func (cp *controlPlane) restoreRealCRDs(ctx context.Context) error {
	var missing []*apiextensionsv1.CustomResourceDefinition
	for _, crd := range cp.realCRDList {
		_, err := cp.ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			missing = append(missing, crd)
		} else if err != nil {
			return err
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := cp.createCRDs(ctx, missing); err != nil {
		return err
	}
	// the re-created CRDs are the baseline now (only they: a reset may have
	// kept fixture objects, which stay the fixture's)
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, crd := range missing {
		got, err := cp.ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cp.baseline[objectKey(gvr, "", crd.Name)] = got.ResourceVersion
	}
	return nil
}
