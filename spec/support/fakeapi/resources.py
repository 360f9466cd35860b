"""Resource types: the built-ins and whatever the stored CRDs define, with their
discovery (verbs, short names, the status subresource) and version order."""

import re

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
SUBRESOURCE_VERBS = ["get", "patch", "update"]


def builtin_group(group):
    """Is this a group kube-apiserver serves itself? Built-in groups have no dot
    (apps, batch) or end in .k8s.io/.kubernetes.io, names a CRD cannot take
    without an API review; every other group comes from CRDs."""
    return "." not in group or group.endswith(".k8s.io") or group.endswith(".kubernetes.io")


class ResType:
    def __init__(self, group, versions, plural, singular, kind, namespaced, short_names=(),
                 categories=(), verbs=ALL_VERBS, status_sub=False, custom=False, list_kind=None):
        self.group = group
        self.versions = list(versions)
        self.plural = plural
        self.singular = singular
        self.kind = kind
        self.list_kind = list_kind or kind + "List"
        self.namespaced = namespaced
        self.short_names = list(short_names)
        self.categories = list(categories)
        self.verbs = list(verbs)
        self.status_sub = status_sub
        self.custom = custom          # a custom resource (served from a CRD)
        # Only CRs and CRDs carry metadata.generation, as on a real server.
        self.has_generation = custom or (group == "apiextensions.k8s.io")

    def api_version(self, version):
        return version if not self.group else "%s/%s" % (self.group, version)


# What a namespace may do: no deletecollection (kube-apiserver's namespace
# storage has none).
NAMESPACE_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def builtin_types():
    """The built-in types a migration may touch, with kube-apiserver's discovery
    (namespaced, shortNames, categories, verbs, the status subresource); served
    generically: stored as sent, no defaulting, no spec validation
    (spec/support/README.md, "Deliberate differences")."""
    return [
        ResType("", ["v1"], "namespaces", "namespace", "Namespace", False, ["ns"], verbs=NAMESPACE_VERBS,
                status_sub=True),
        ResType("", ["v1"], "configmaps", "configmap", "ConfigMap", True, ["cm"]),
        ResType("", ["v1"], "secrets", "secret", "Secret", True),
        ResType("", ["v1"], "services", "service", "Service", True, ["svc"], ["all"], status_sub=True),
        ResType("", ["v1"], "pods", "pod", "Pod", True, ["po"], ["all"], status_sub=True),
        ResType("", ["v1"], "persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim", True,
                ["pvc"], status_sub=True),
        ResType("", ["v1"], "persistentvolumes", "persistentvolume", "PersistentVolume", False, ["pv"],
                status_sub=True),
        ResType("", ["v1"], "serviceaccounts", "serviceaccount", "ServiceAccount", True, ["sa"]),
        ResType("apps", ["v1"], "deployments", "deployment", "Deployment", True, ["deploy"], ["all"],
                status_sub=True),
        ResType("apps", ["v1"], "statefulsets", "statefulset", "StatefulSet", True, ["sts"], ["all"],
                status_sub=True),
        ResType("apps", ["v1"], "daemonsets", "daemonset", "DaemonSet", True, ["ds"], ["all"], status_sub=True),
        ResType("apps", ["v1"], "replicasets", "replicaset", "ReplicaSet", True, ["rs"], ["all"], status_sub=True),
        ResType("coordination.k8s.io", ["v1"], "leases", "lease", "Lease", True),
        ResType("events.k8s.io", ["v1"], "events", "event", "Event", True, ["ev"]),
        ResType("apiextensions.k8s.io", ["v1"], "customresourcedefinitions", "customresourcedefinition",
                "CustomResourceDefinition", False, ["crd", "crds"], ["api-extensions"], status_sub=True),
        ResType("authorization.k8s.io", ["v1"], "selfsubjectaccessreviews", "selfsubjectaccessreview",
                "SelfSubjectAccessReview", False, verbs=["create"]),
        ResType("authorization.k8s.io", ["v1"], "subjectaccessreviews", "subjectaccessreview",
                "SubjectAccessReview", False, verbs=["create"]),
        ResType("authentication.k8s.io", ["v1"], "selfsubjectreviews", "selfsubjectreview",
                "SelfSubjectReview", False, verbs=["create"]),
    ]


_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(v):
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first, others last."""
    m = _VERSION_RE.match(v)
    if not m:
        return (3, 0, 0, v)
    major, kind, minor = int(m.group(1)), m.group(2), int(m.group(3) or 0)
    return ({None: 0, "beta": 1, "alpha": 2}[kind], -major, -minor, v)


def crd_type(crd):
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
    if not versions:
        return None
    ordered = sorted((v["name"] for v in versions), key=version_priority)
    status_sub = any("status" in ((v.get("subresources") or {})) for v in versions)
    return ResType(spec.get("group", ""), ordered, names.get("plural", ""),
                   names.get("singular") or names.get("kind", "").lower(), names.get("kind", ""),
                   spec.get("scope", "Namespaced") == "Namespaced", names.get("shortNames") or [],
                   names.get("categories") or [], status_sub=status_sub, custom=True,
                   list_kind=names.get("listKind"))


def versioned(rt, version, obj):
    """obj as the given version of rt serves it: apiVersion and kind set (a shallow
    copy when they differ; the stored object is never mutated)."""
    av = rt.api_version(version)
    if obj.get("apiVersion") == av and obj.get("kind") == rt.kind:
        return obj
    o = dict(obj)
    o["apiVersion"] = av
    o["kind"] = rt.kind
    return o
