"""Small helpers every module uses: the time stamp, JSON encoding, deep copies,
an object's list key, atomic file writes."""

import datetime
import json
import os
import tempfile


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


def write_atomic(path, data):
    """Writes data at path through a temporary file and a rename: a reader never sees half of it."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".fake-apiserver.")
    with os.fdopen(fd, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())
    os.rename(tmp, path)
