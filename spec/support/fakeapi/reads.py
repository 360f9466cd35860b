"""Reads: get, list (pages with continue tokens in the shape of the real ones,
base64 of a small JSON, and the snapshots behind them), Tables for kubectl."""

import base64
import json

from fakeapi.errors import err_bad_request


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
