"""Object rules kube-apiserver applies to metadata on every write: label and
annotation keys and values (with its messages), the maps it drops when empty,
the namespace name label it sets."""

import json
import re


def drop_empty_maps(rt, obj):
    """An empty map that a write leaves (a merge patch that removed the last
    label) is not stored: kube-apiserver decodes into Go structs whose maps
    are omitempty (ObjectMeta's labels and annotations, a ConfigMap's data)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        for f in ("labels", "annotations"):
            if meta.get(f) == {}:
                del meta[f]
    if not rt.group and rt.plural == "configmaps":
        for f in ("data", "binaryData"):
            if obj.get(f) == {}:
                del obj[f]


def name_label(rt, obj):
    """A namespace always carries kubernetes.io/metadata.name = its name:
    kube-apiserver sets it on every create and update (namespace strategy's
    PrepareForCreate/PrepareForUpdate), whatever the write said."""
    if rt.plural == "namespaces" and not rt.group:
        meta = obj.setdefault("metadata", {})
        labels = meta.get("labels")
        if not isinstance(labels, dict):
            labels = meta["labels"] = {}
        labels["kubernetes.io/metadata.name"] = meta.get("name", "")


# Label and annotation keys and label values as kube-apiserver checks them
# (apimachinery's validation.IsQualifiedName and IsValidLabelValue), with its
# messages: the fake used to store keys a real server refuses.
_QNAME_CHARS = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_QNAME_RE = re.compile(r"^(" + _QNAME_CHARS + r")\Z")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QNAME_ERR = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
              "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
              "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
_SUBDOMAIN_ERR = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                  "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                  "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
_LABEL_VALUE_ERR = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                    "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                    "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")


def qualified_name_errors(value):
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
        errs = []
    elif len(parts) == 2:
        prefix, name = parts
        errs = []
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                errs.append("prefix part must be no more than 253 characters")
            if not _DNS1123_SUBDOMAIN.match(prefix):
                errs.append("prefix part " + _SUBDOMAIN_ERR)
    else:
        return ["a qualified name " + _QNAME_ERR + " with an optional DNS subdomain prefix and '/' "
                "(e.g. 'example.com/MyName')"]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if name and not _QNAME_RE.match(name):
        errs.append("name part " + _QNAME_ERR)
    return errs


def go_quote(s):
    """Go's %q of an ASCII-printable string (what field.Invalid prints)."""
    return json.dumps(s, ensure_ascii=False)


def meta_map_causes(meta):
    """The causes kube-apiserver's ObjectMeta validation gives for labels and
    annotations, in its order: label keys and values (keys sorted), then
    annotation keys (checked lowercased)."""
    causes = []
    labels = meta.get("labels") or {}
    for k in sorted(labels):
        for e in qualified_name_errors(k):
            causes.append(("metadata.labels", "FieldValueInvalid", "Invalid value: %s: %s" % (go_quote(k), e)))
        v = labels[k]
        if isinstance(v, str):
            if len(v) > 63:
                causes.append(("metadata.labels", "FieldValueInvalid",
                               "Invalid value: %s: must be no more than 63 characters" % go_quote(v)))
            if v and not _QNAME_RE.match(v):
                causes.append(("metadata.labels", "FieldValueInvalid",
                               "Invalid value: %s: %s" % (go_quote(v), _LABEL_VALUE_ERR)))
    annotations = meta.get("annotations") or {}
    for k in sorted(annotations):
        for e in qualified_name_errors(k.lower()):
            causes.append(("metadata.annotations", "FieldValueInvalid",
                           "Invalid value: %s: %s" % (go_quote(k), e)))
    return causes
