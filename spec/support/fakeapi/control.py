"""The control endpoints under /_fake/ (spec/support/README.md, "Control
endpoints"): the stored objects, the request log, fault, deny and allow rules,
a reset to new fixtures, a token rotation, a compaction. One function per
endpoint, looked up by method and path."""

import json
import urllib.parse

from fakeapi.authz import prepare_allow_rules
from fakeapi.errors import ApiError
from fakeapi.faults import FaultRuleError, prepare_fault_rules
from fakeapi.store import load_fixture_text
from fakeapi.util import dumps

OK = {"Content-Type": "application/json"}


def get_objects(server, body):
    st = server.state
    with st.lock:
        items = [o for key in sorted(st.objects) for _, o in sorted(st.objects[key].items())]
        return 200, OK, dumps({"kind": "List", "apiVersion": "v1",
                               "metadata": {"resourceVersion": str(st.rv)}, "items": items})


def get_requests(server, body):
    st = server.state
    with st.lock:
        return 200, OK, dumps(st.log)


def clear_requests(server, body):
    st = server.state
    with st.lock:
        st.log = []
    return 200, OK, b"{}"


def add_faults(server, body):
    st = server.state
    try:
        rules = json.loads(body or b"[]")
    except ValueError as e:
        raise ApiError(400, "BadRequest", "fault rules are not JSON: %s" % e, {})
    with st.lock:
        try:
            prepared = prepare_fault_rules(rules, len(st.faults))
        except FaultRuleError as e:
            raise ApiError(400, "BadRequest", str(e), {})
        st.faults.extend(prepared)
    return 200, OK, dumps({"added": len(prepared)})


def get_faults(server, body):
    st = server.state
    with st.lock:
        return 200, OK, dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in st.faults])


def clear_faults(server, body):
    st = server.state
    with st.lock:
        st.faults = []
    return 200, OK, b"{}"


def set_denies(server, body):
    st = server.state
    rules = json.loads(body or b"[]")
    with st.lock:
        st.runtime_denies = [r for r in rules if isinstance(r, dict)]
    return 200, OK, b"{}"


def set_allows(server, body):
    st = server.state
    try:
        rules = json.loads(body or b"null")
        prepared = None if rules is None else prepare_allow_rules(rules)
    except ValueError as e:
        raise ApiError(400, "BadRequest", "allow rules: %s" % e, {})
    with st.lock:
        st.runtime_allows = prepared
    return 200, OK, b"{}"


def get_allows(server, body):
    st = server.state
    with st.lock:
        on = st.runtime_allows is not None or bool(st.fixture_allows)
        return 200, OK, dumps({"enabled": on, "fixture": st.fixture_allows, "runtime": st.runtime_allows})


def reset(server, body):
    st = server.state
    items = load_fixture_text(body.decode("utf-8")) if body.strip() else []
    st.reset(items)
    return 200, OK, dumps({"resourceVersion": str(st.rv)})


def set_token(server, body):
    # a token rotation: from now on only the new token is accepted
    server.token = json.loads(body or b"{}").get("token")
    return 200, OK, b"{}"


def compact(server, body):
    st = server.state
    with st.lock:
        st.compacted = st.rv
        st.snapshots.clear()
        return 200, OK, dumps({"compacted": str(st.rv)})


ENDPOINTS = {
    ("GET", "/_fake/objects"): get_objects,
    ("GET", "/_fake/requests"): get_requests,
    ("DELETE", "/_fake/requests"): clear_requests,
    ("POST", "/_fake/faults"): add_faults,
    ("GET", "/_fake/faults"): get_faults,
    ("DELETE", "/_fake/faults"): clear_faults,
    ("POST", "/_fake/denies"): set_denies,
    ("POST", "/_fake/allows"): set_allows,
    ("GET", "/_fake/allows"): get_allows,
    ("POST", "/_fake/reset"): reset,
    ("POST", "/_fake/token"): set_token,
    ("POST", "/_fake/compact"): compact,
}


def control(server, method, target, body):
    """(code, headers, body) of a control request; ApiError for a bad one."""
    path = urllib.parse.urlsplit(target).path.rstrip("/")
    endpoint = ENDPOINTS.get((method, path))
    if endpoint is None:
        return 404, OK, dumps({"error": "unknown control endpoint %s %s" % (method, path)})
    return endpoint(server, body)
