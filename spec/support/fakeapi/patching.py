"""Patches: JSON patch's copy-on-write preparation, RFC 7386 merge patch and
strategic merge patch, and the content types that name them."""

import json

from fakeapi.util import deep

PATCH_JSON = "application/json-patch+json"
PATCH_MERGE = "application/merge-patch+json"
PATCH_STRATEGIC = "application/strategic-merge-patch+json"
PATCH_APPLY = "application/apply-patch+yaml"


def copy_for_patch(doc, ops):
    """A copy of a stored object that the JSON patch `ops` may change in place, or
    None when only a deep copy is safe. The top level, metadata (commit() rewrites
    fields of both) and every container on the path of an op that writes are
    copied; everything else is shared with the stored object, which is never
    mutated. Only for ops whose paths stay put while the patch applies: test, add,
    replace and remove through object keys and appends ("-"), no array index
    (an earlier op could shift what a later op's index names) and no move or copy."""
    paths = []
    for op in ops:
        path = op.get("path")
        if op.get("op") not in ("test", "add", "replace", "remove") or not isinstance(path, str):
            return None
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]
        if any(t.isdigit() for t in tokens):
            return None
        if op.get("op") != "test":
            paths.append(tokens)
    new = dict(doc)
    if isinstance(new.get("metadata"), dict):
        new["metadata"] = dict(new["metadata"])
    for tokens in paths:
        node = new
        for i, token in enumerate(tokens[:-1]):
            child = node.get(token) if isinstance(node, dict) else None
            if not isinstance(child, (dict, list)):
                break  # the patch fails here, or writes into what it creates itself
            if not (i == 0 and token == "metadata"):  # copied already
                child = node[token] = dict(child) if isinstance(child, dict) else list(child)
            node = child
    return new


def go_json_kind(v):
    """The JSON kind encoding/json names in an UnmarshalTypeError."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return {dict: "object", list: "array", str: "string"}.get(type(v), "null")


def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return deep(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


# Lists that strategic merge merges instead of replacing, for the types served
# here (ConfigMap, Namespace, Lease have none of their own beyond metadata).
_SMP_MERGE_KEYS = {("metadata", "finalizers"): None, ("metadata", "ownerReferences"): "uid"}

# The pod template's lists, by their field name (wherever a PodSpec sits: a
# Pod's spec, a workload's spec.template.spec, a CronJob's job template), with
# kube-apiserver's patchMergeKey (k8s.io/api/core/v1 types.go). Only of the
# pod-bearing built-in groups: a custom resource takes no strategic merge.
_POD_MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
                   "volumes": "name", "env": "name", "imagePullSecrets": "name", "volumeMounts": "mountPath"}


def _merge_key(path):
    """The merge key of the list at path, as (True, key or None for a set of
    scalars), or (False, None) for a list the patch replaces."""
    if path in _SMP_MERGE_KEYS:
        return True, _SMP_MERGE_KEYS[path]
    if path and path[0] == "spec" and path[-1] in _POD_MERGE_KEYS:
        return True, _POD_MERGE_KEYS[path[-1]]
    if len(path) >= 2 and path[0] == "spec" and path[-1] == "ports" and path[-2] in (
            "containers", "initContainers", "ephemeralContainers"):
        return True, "containerPort"
    return False, None


def _element_order(merged, patch_list, set_order, original, key):
    """kube-apiserver's order of a merged list (apimachinery strategicpatch
    normalizeElementOrder): the patch's items in the patch's order (its
    $setElementOrder when it has one), the others in the original's order,
    interleaved: an item of the original goes before a patch item only where
    both are in the original and it comes first there. So an item the patch
    adds goes before the original's items after the last patch item placed."""
    def ident(x):
        return x.get(key) if key is not None and isinstance(x, dict) else json.dumps(x, sort_keys=True)
    order = [ident(x) for x in (set_order if isinstance(set_order, list) else patch_list)
             if not (isinstance(x, dict) and x.get("$patch") == "delete")]
    in_patch = set(order)
    where = {ident(x): i for i, x in enumerate(original)}
    patched = sorted((m for m in merged if ident(m) in in_patch), key=lambda m: order.index(ident(m)))
    server_only = sorted((m for m in merged if ident(m) not in in_patch), key=lambda m: where.get(ident(m), 0))
    out, i, j = [], 0, 0
    while i < len(server_only) or j < len(patched):
        if j >= len(patched):
            out.append(server_only[i])
            i += 1
        elif i >= len(server_only):
            out.append(patched[j])
            j += 1
        else:
            li, ri = where.get(ident(server_only[i])), where.get(ident(patched[j]))
            if li is not None and ri is not None and li < ri:
                out.append(server_only[i])
                i += 1
            else:
                out.append(patched[j])
                j += 1
    return out


def strategic_merge(target, patch, path=()):
    if not isinstance(patch, dict):
        return deep(patch)
    if patch.get("$patch") == "replace":
        return {k: deep(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/") or k == "$retainKeys" or k == "$patch":
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            name = k.split("/", 1)[1]
            if isinstance(result.get(name), list):
                result[name] = [x for x in result[name] if x not in v]
            continue
        if v is None:
            result.pop(k, None)
            continue
        sub = path + (k,)
        merges, key = _merge_key(sub) if isinstance(v, list) else (False, None)
        if merges and isinstance(result.get(k), list):
            merged = list(result[k])
            for item in v:
                if key is None:
                    if item not in merged:
                        merged.append(item)
                elif isinstance(item, dict):
                    idx = next((i for i, o in enumerate(merged)
                                if isinstance(o, dict) and o.get(key) == item.get(key)), None)
                    if item.get("$patch") == "delete":
                        if idx is not None:
                            merged.pop(idx)
                    elif idx is None:
                        merged.append(deep(item))
                    else:
                        merged[idx] = strategic_merge(merged[idx], item, sub)
            result[k] = _element_order(merged, v, patch.get("$setElementOrder/" + k), result[k], key)
        elif isinstance(v, dict):
            r = strategic_merge(result.get(k), v, sub)
            if r is None:
                result.pop(k, None)
            else:
                result[k] = r
        else:
            result[k] = deep(v)
    return result
