"""Label and field selectors: parsed as kube-apiserver parses them, matched
against an object's metadata."""

import re

from fakeapi.errors import err_bad_request

_LABEL_TERM = re.compile(r"^\s*(!)?\s*([A-Za-z0-9._/-]+)\s*(?:(==|=|!=|\s+in\s+|\s+notin\s+)\s*(.*?))?\s*$")


def split_top(s):
    out, depth, cur = [], 0, []
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [t for t in out if t.strip()]


def parse_label_selector(s):
    reqs = []
    for term in split_top(s or ""):
        m = _LABEL_TERM.match(term)
        if not m:
            raise err_bad_request("unable to parse requirement: %s" % term.strip())
        neg, key, op, val = m.groups()
        op = (op or "").strip()
        if neg:
            if op:
                raise err_bad_request("unable to parse requirement: %s" % term.strip())
            reqs.append(("!", key, None))
        elif not op:
            reqs.append(("exists", key, None))
        elif op in ("=", "=="):
            reqs.append(("=", key, val))
        elif op == "!=":
            reqs.append(("!=", key, val))
        else:
            if not (val.startswith("(") and val.endswith(")")):
                raise err_bad_request("unable to parse requirement: %s" % term.strip())
            values = {v.strip() for v in val[1:-1].split(",")}
            reqs.append((op, key, values))
    return reqs


def labels_match(reqs, labels):
    for op, key, val in reqs:
        have = key in labels
        cur = labels.get(key)
        if op == "!" and have:
            return False
        if op == "exists" and not have:
            return False
        if op == "=" and cur != val:
            return False
        if op == "!=" and have and cur == val:
            return False
        if op == "in" and (not have or cur not in val):
            return False
        if op == "notin" and have and cur in val:
            return False
    return True


def parse_field_selector(s):
    reqs = []
    for term in split_top(s or ""):
        m = re.match(r"^\s*([A-Za-z0-9._]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise err_bad_request("invalid selector: '%s'; can't understand '%s'" % (s, term))
        field, op, val = m.groups()
        if field not in ("metadata.name", "metadata.namespace"):
            raise err_bad_request('field label not supported: %s' % field)
        reqs.append((field, op, val))
    return reqs


def fields_match(reqs, meta):
    for field, op, val in reqs:
        cur = meta.get("name" if field == "metadata.name" else "namespace", "")
        if (op == "!=") == (cur == val):
            return False
    return True
