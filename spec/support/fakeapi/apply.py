"""Server-side apply (PATCH application/apply-patch+yaml), as far as the
engine's specs use it: create when absent, the applied fields merged into the
object, each apply manager's fields recorded in metadata.managedFields
(operation "Apply", fieldsV1), a field another apply manager owns with a
different value a 409 Conflict unless force=true (which takes it over), and a
field a manager applied before and applies no more removed when no other
manager owns it. Maps merge key by key; anything else (lists included) is one
field. Writes other than apply own nothing here (spec/support/README.md,
"Deliberate differences")."""

import json

from fakeapi.errors import ApiError, err_bad_request
from fakeapi.util import deep, now_rfc3339

# Fields an apply names the object by, owned by no manager.
_IDENTITY = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}
# Metadata the server keeps, never the applied configuration's.
_SERVER_META = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields",
                "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink")


def leaves(value, path=()):
    """The field paths an applied configuration sets: each map walked key by key,
    any other value (a list, a scalar, an empty map) one field."""
    if isinstance(value, dict) and value:
        out = set()
        for k, v in value.items():
            out |= leaves(v, path + (k,))
        return out
    return {path}


def fields_v1(paths):
    """A set of field paths as managedFields' fieldsV1 ({"f:data": {"f:k": {}}})."""
    tree = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault("f:" + key, {})
    return tree


def paths_of(tree, path=()):
    """fieldsV1 back to field paths (only "f:" members: the fake writes no others)."""
    out = set()
    for k, v in (tree or {}).items():
        if not k.startswith("f:"):
            continue
        sub = path + (k[2:],)
        children = paths_of(v, sub)
        out |= children if children else {sub}
    return out


def value_at(obj, path):
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def set_at(obj, path, value):
    for key in path[:-1]:
        if not isinstance(obj.get(key), dict):
            obj[key] = {}
        obj = obj[key]
    obj[path[-1]] = deep(value)


def remove_at(obj, path):
    """Removes the field at path, and each map above it the removal left empty."""
    parents = []
    for key in path[:-1]:
        if not isinstance(obj.get(key), dict):
            return
        parents.append((obj, key))
        obj = obj[key]
    obj.pop(path[-1], None)
    for parent, key in reversed(parents):
        if parent[key]:
            break
        parent.pop(key)


def overlaps(a, b):
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def owners(obj):
    """The apply managers of a stored object: {manager: (apiVersion, set of paths)}."""
    out = {}
    for entry in (obj or {}).get("metadata", {}).get("managedFields") or []:
        if entry.get("operation") == "Apply" and entry.get("manager"):
            out[entry["manager"]] = (entry.get("apiVersion"), paths_of(entry.get("fieldsV1")))
    return out


def conflicts(current, applied, paths, manager, others):
    """[(manager, path)] of the fields another manager owns with another value."""
    out = []
    for other, (_, owned) in sorted(others.items()):
        if other == manager:
            continue
        for p in sorted(paths):
            if any(overlaps(p, q) for q in owned) and value_at(current, p) != value_at(applied, p):
                out.append((other, p))
    return out


def err_apply_conflict(found):
    """409 as the real server words it (structured-merge-diff's conflicts, an apply
    manager named by its name alone, as the apiserver's printManager does)."""
    causes = [{"reason": "FieldManagerConflict", "message": 'conflict with "%s"' % m,
               "field": "." + ".".join(p)} for m, p in found]
    if len(found) == 1:
        text = "Apply failed with 1 conflict: %s: %s" % (causes[0]["message"], causes[0]["field"])
    else:
        by = {}
        for c in causes:
            by.setdefault(c["message"].replace("conflict with", "conflicts with", 1), []).append(c["field"])
        text = "Apply failed with %d conflicts: " % len(found) + "\n".join(
            "%s:\n%s" % (k, "\n".join("- " + f for f in v)) for k, v in by.items())
    return ApiError(409, "Conflict", text, {"causes": causes})


class ApplyMixin:
    """Api's server-side apply (fakeapi.routing.Api; called from WritesMixin.patch)."""

    def parse_apply(self, req, rt, ns, name):
        manager = req.q("fieldManager")
        if not manager:
            raise err_invalid_options("fieldManager: Required value: is required for apply patch")
        try:
            applied = json.loads(req.body or b"")
        except (ValueError, UnicodeDecodeError) as e:
            # the fake reads JSON, the subset of YAML the engine sends
            raise err_bad_request("error decoding YAML: the fake reads apply patches as JSON only: %s" % e)
        if not isinstance(applied, dict):
            raise err_bad_request("error decoding YAML: an apply patch must be an object")
        if not applied.get("apiVersion") or not applied.get("kind"):
            raise err_bad_request("invalid object type: /, Kind=")
        meta = applied.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise err_bad_request("metadata must be an object")
        if meta.get("name", name) != name:
            raise err_bad_request('the name of the object (%s) does not match the name on the URL (%s)'
                                  % (meta.get("name"), name))
        if rt.namespaced and meta.get("namespace", ns) != ns:
            raise err_bad_request("the namespace of the provided object does not match the namespace sent on the request")
        for f in _SERVER_META:
            meta.pop(f, None)
        force = req.q("force") in ("true", "1")
        return manager, force, applied

    def apply_patch(self, req, rt, version, ns, name, sub, dry):
        if sub:
            raise ApiError(415, "UnsupportedMediaType", "the fake serves server-side apply on objects, "
                           "not on their subresources", {})
        manager, force, applied = self.parse_apply(req, rt, ns, name)
        self.check_type_meta(rt, version, applied)
        with self.state.lock:
            bucket = self.state.bucket(rt)
            old = bucket.get((ns or "", name))
            new = self.applied_object(rt, old, applied, manager, force)
            if old is None:
                return self.insert(rt, version, ns, new, dry)
            return self.commit(rt, version, ns, name, old, new, sub, dry, require_rv=False)

    def applied_object(self, rt, old, applied, manager, force):
        """The object after manager applies `applied`: raises the 409 of its conflicts."""
        paths = leaves(applied) - _IDENTITY
        managers = owners(old)
        found = conflicts(old or {}, applied, paths, manager, managers)
        if found and not force:
            raise err_apply_conflict(found)
        new = deep(old) if old is not None else {"apiVersion": applied["apiVersion"], "kind": applied["kind"],
                                                "metadata": {}}
        for other, (version, owned) in list(managers.items()):
            if other != manager and force:
                managers[other] = (version, {q for q in owned if not any(overlaps(p, q) for p in paths)})
        _, before = managers.get(manager, (None, set()))
        for p in sorted(before - paths, key=len, reverse=True):
            if not any(overlaps(p, q) for m, (_, owned) in managers.items() if m != manager for q in owned):
                remove_at(new, p)
        for p in paths:
            set_at(new, p, value_at(applied, p))
        new["metadata"]["name"] = applied["metadata"].get("name")
        self.record_managers(new, old, managers, manager, applied["apiVersion"], paths)
        return new

    @staticmethod
    def record_managers(new, old, managers, manager, api_version, paths):
        """metadata.managedFields of new: the apply managers' sets (manager's now
        `paths`), an entry's time kept while its fields are what they were."""
        previous = {e.get("manager"): e for e in (old or {}).get("metadata", {}).get("managedFields") or []
                    if e.get("operation") == "Apply"}
        managers = dict(managers)
        managers[manager] = (api_version, paths)
        entries = []
        for m, (version, owned) in sorted(managers.items()):
            if not owned:
                continue
            entry = {"manager": m, "operation": "Apply", "apiVersion": version, "time": now_rfc3339(),
                     "fieldsType": "FieldsV1", "fieldsV1": fields_v1(owned)}
            kept = previous.get(m)
            if kept is not None and kept.get("fieldsV1") == entry["fieldsV1"] and kept.get("apiVersion") == version:
                entry = kept
            entries.append(entry)
        if entries:
            new["metadata"]["managedFields"] = entries
        else:
            new["metadata"].pop("managedFields", None)


def err_invalid_options(message):
    """422 on the request's PatchOptions, as kube-apiserver words it."""
    return ApiError(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: %s' % message,
                    {"group": "meta.k8s.io", "kind": "PatchOptions",
                     "causes": [{"reason": "FieldValueRequired", "message": "Required value: is required for apply patch",
                                 "field": "fieldManager"}]})

