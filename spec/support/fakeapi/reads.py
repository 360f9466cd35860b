"""Reads: get, list (pages with continue tokens in the shape of the real ones,
base64 of a small JSON, and the snapshots behind them), Tables for kubectl."""

import base64
import datetime
import json

from fakeapi.errors import ApiError, MSG_EXPIRED, err_bad_request, err_not_found
from fakeapi.selectors import fields_match, labels_match, parse_field_selector, parse_label_selector
from fakeapi.util import dumps, item_key


def encode_continue(rv, start):
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_continue(token):
    try:
        pad = "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(token + pad).decode())
        if data.get("v") != "meta.k8s.io/v1" or not isinstance(data.get("rv"), int) \
                or not isinstance(data.get("start"), str):
            raise ValueError("bad token")
        return data["rv"], data["start"]
    except Exception:
        raise err_bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")


def human_age(ts):
    try:
        t = datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    except (TypeError, ValueError):
        return "<unknown>"
    s = int((datetime.datetime.now(datetime.timezone.utc) - t).total_seconds())
    if s < 0:
        return "0s"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n * 2 or (unit == "m" and s >= 60):
            return "%d%s" % (s // n, unit)
    return "%ds" % s


class ReadsMixin:
    """Api's read verbs (fakeapi.routing.Api)."""

    # -- reads ---------------------------------------------------------------------
    def wants_table(self, req):
        return "as=Table" in req.accept

    def table(self, req, rt, objs, list_meta):
        include = req.q("includeObject", "Metadata")
        rows = []
        for o in objs:
            meta = o.get("metadata", {})
            row = {"cells": [meta.get("name", ""), human_age(meta.get("creationTimestamp"))]}
            if include == "Object":
                row["object"] = o
            elif include != "None":
                row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
            rows.append(row)
        return self.json(200, {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
                               "columnDefinitions": [
                                   {"name": "Name", "type": "string", "format": "name", "priority": 0,
                                    "description": "Name must be unique within a namespace."},
                                   {"name": "Age", "type": "string", "format": "", "priority": 0,
                                    "description": "CreationTimestamp is a timestamp representing the server time "
                                                   "when this object was created."}],
                               "rows": rows})

    def get(self, req, rt, version, ns, name):
        st = self.state
        with st.lock:
            o = st.objects.get((rt.group, rt.plural), {}).get((ns or "", name))
            if o is None:
                raise err_not_found(rt, name)
            o = self.versioned(rt, version, o)
            if self.wants_table(req):
                return self.table(req, rt, [o], {"resourceVersion": o["metadata"].get("resourceVersion", "")})
            return 200, {"Content-Type": "application/json"}, dumps(o)

    def select(self, req, rt, ns):
        labels = parse_label_selector(req.q("labelSelector", ""))
        fields = parse_field_selector(req.q("fieldSelector", ""))
        bucket = self.state.objects.get((rt.group, rt.plural), {})
        out = []
        for (ons, oname), o in bucket.items():
            if ns is not None and ons != ns:
                continue
            meta = o["metadata"]
            if labels and not labels_match(labels, meta.get("labels") or {}):
                continue
            if fields and not fields_match(fields, meta):
                continue
            out.append((item_key(ons, oname), o))
        out.sort(key=lambda kv: kv[0])
        return out, bool(labels or fields)

    def list(self, req, rt, version, ns):
        st = self.state
        limit = req.q("limit")
        try:
            limit = int(limit) if limit not in (None, "") else 0
        except ValueError:
            raise err_bad_request('invalid limit: "%s"' % limit)
        token = req.q("continue")
        with st.lock:
            list_rv = st.rv
            start = None
            if token:
                token_rv, start = decode_continue(token)
                if 0 <= token_rv <= st.compacted:
                    raise ApiError(410, "Expired", MSG_EXPIRED,
                                   extra_meta={"continue": encode_continue(-1, start)})
                if token_rv >= 0:
                    list_rv = token_rv
            snap_key = (rt.group, rt.plural, ns, req.q("labelSelector", ""), req.q("fieldSelector", ""), list_rv)
            snapshot = st.snapshots.get(snap_key) if token else None
            if snapshot is not None:
                matched, filtered = snapshot
            else:
                matched, filtered = self.select(req, rt, ns)
            if limit > 0 and len(matched) > limit and snapshot is None and list_rv >= 0:
                st.snapshots[snap_key] = (matched, filtered)
                while len(st.snapshots) > 256:
                    st.snapshots.popitem(last=False)
            if start is not None:
                matched = [kv for kv in matched if kv[0] > start]
            meta = {"resourceVersion": str(list_rv)}
            if limit > 0 and len(matched) > limit:
                page = matched[:limit]
                meta["continue"] = encode_continue(list_rv, page[-1][0])
                if not filtered:
                    meta["remainingItemCount"] = len(matched) - limit
            else:
                page = matched
            av = rt.api_version(version)
            if self.wants_table(req):
                return self.table(req, rt, [self.versioned(rt, version, o) for _, o in page], meta)
            if rt.custom:
                # the bytes dumps() would give for the whole list, items from the cache
                parts = [st.encoded_item(rt, version, key, o) for key, o in page]
                return 200, {"Content-Type": "application/json"}, b"".join([
                    b'{"kind":', dumps(rt.list_kind), b',"apiVersion":', dumps(av), b',"metadata":', dumps(meta),
                    b',"items":[', b",".join(parts), b"]}"])
            # typed lists do not repeat apiVersion/kind on their items
            items = [{k: v for k, v in o.items() if k not in ("apiVersion", "kind")} for _, o in page]
            return 200, {"Content-Type": "application/json"}, dumps(
                {"kind": rt.list_kind, "apiVersion": av, "metadata": meta, "items": items})

    def watch(self, req, rt, version, ns, name):
        """Streams events until the client goes away or timeoutSeconds passes."""
        return ("watch", rt, version, ns, name)
