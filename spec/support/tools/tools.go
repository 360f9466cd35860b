//go:build tools

// helm is built from its own main package (helm.sh/helm/v3/cmd/helm), not a
// copy: this import keeps it, and everything it needs, in go.mod and go.sum.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
