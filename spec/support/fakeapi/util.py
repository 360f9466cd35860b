"""Small helpers every module uses: the time stamp, JSON encoding, deep copies,
an object's list key."""

import datetime
import json


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def dumps(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def deep(obj):
    # JSON values only: a JSON round trip is both a deep copy and a sanity check.
    return json.loads(json.dumps(obj))


def item_key(ns, name):
    """An object's key in a list: "ns/name", or "name" when cluster-scoped (also its sort key)."""
    return "%s/%s" % (ns, name) if ns else name
