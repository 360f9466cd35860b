// kubectl, as k8s.io/kubernetes/cmd/kubectl builds it, from k8s.io/kubectl at
// the control plane's release: the client legacy migration scripts run under
// and the specs apply rendered charts with.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	// client-go's credential plugins (exec, oidc), as the release binary has
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		// Pretty-print the error and exit with an error.
		util.CheckErr(err)
	}
}
