"""Make an HTTP request and check the answer, retrying until a condition holds.

Arguments:
    url: ``http(s)://...``, required. method: GET (default) or POST (or any verb).
    body: request body (a string, or a mapping/list sent as JSON with ``body_format: json``).
    headers: mapping. timeout: seconds per request (default 10).
    status_code: wanted status, an int or a list (default 200).
    body_contains: text the body must contain.
    until: Jinja2 condition over the result (``status``, ``body``, ``json``), retried until true.
    retries: extra attempts (default 0; 3 when ``until`` is given, Ansible's default).
    delay: seconds between attempts (default 5).
    from: ``controller`` (default) or ``host`` (``python3`` urllib on the target, one round trip
        per attempt).

Reports ``ok`` on success (a request changes nothing we track) and ``failed`` with the last
status and body otherwise. Not sent in check mode for methods other than GET/HEAD (``skipped``).
Example::

    - name: Wait until vLLM answers
      http: {url: "http://{{ node.host_ip }}:8000/health", until: "status == 200",
             retries: 60, delay: 5}
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from vllm_provision.errors import ProvisionError
from vllm_provision.modules import ModuleResult, check_arguments, check_type, quote, require
from vllm_provision.results import Status

ARGUMENTS = ("url", "method", "body", "body_format", "headers", "timeout", "status_code",
             "body_contains", "until", "retries", "delay", "from")

_REMOTE = r"""
import json, sys, urllib.request, urllib.error
req = json.loads(sys.stdin.read())
r = urllib.request.Request(req["url"], data=req["body"].encode() if req["body"] is not None
                           else None, method=req["method"], headers=req["headers"])
try:
    with urllib.request.urlopen(r, timeout=req["timeout"]) as resp:
        out = {"status": resp.status, "body": resp.read().decode("utf-8", "replace")}
except urllib.error.HTTPError as e:
    out = {"status": e.code, "body": e.read().decode("utf-8", "replace")}
except Exception as e:
    out = {"status": -1, "body": "", "error": str(e)}
print(json.dumps(out))
"""


def run(ctx: Any, args: Mapping[str, Any]) -> ModuleResult:
    """Send the request (with retries); see the module docstring.

    Raises:
        ProvisionError: bad arguments. UnreachableError: the connection failed (``from: host``).
    """
    check_arguments(args, ARGUMENTS, "http")
    url = require(args, "url", "http")
    if not url.startswith(("http://", "https://")):
        raise ProvisionError.single("http: url", "not an http(s) URL", actual=url)
    method = (check_type(args, "method", "http", str) or "GET").upper()
    body = args.get("body")
    body_format = check_type(args, "body_format", "http", str) or (
        "json" if isinstance(body, (Mapping, list)) else "raw")
    headers = dict(check_type(args, "headers", "http", Mapping) or {})
    if body is not None and body_format == "json":
        body = json.dumps(body)
        headers.setdefault("Content-Type", "application/json")
    elif body is not None:
        body = str(body)
    timeout = float(check_type(args, "timeout", "http", (int, float)) or 10)
    wanted = args.get("status_code", 200)
    wanted_codes = set(wanted) if isinstance(wanted, list) else {wanted}
    contains = check_type(args, "body_contains", "http", str)
    until = args.get("until")
    retries = check_type(args, "retries", "http", int)
    retries = (3 if until else 0) if retries is None else retries
    delay = float(check_type(args, "delay", "http", (int, float)) or 5)
    origin = check_type(args, "from", "http", str) or "controller"
    if origin not in ("controller", "host"):
        raise ProvisionError.single("http: from", "invalid origin",
                                    expected="controller or host", actual=origin)
    if ctx.check_mode and method not in ("GET", "HEAD"):
        return ModuleResult(Status.SKIPPED, f"{method} not sent in check mode")
    # Check mode never waits: what a retried request waits for (a server coming up, a watchdog
    # released) is started by the real run, which check mode does not do. One request answers
    # "is it already so"; anything else is reported as not waited for.
    waiting = ctx.check_mode and retries > 0
    if waiting:
        retries = 0
    request = {"url": url, "method": method, "body": body, "headers": headers,
               "timeout": timeout}
    answer: dict[str, Any] = {}
    problem = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(delay)
        answer = _send_remote(ctx, request) if origin == "host" else _send(request)
        problem = _judge(ctx, answer, wanted_codes, contains, until)
        if not problem:
            return ModuleResult(Status.OK, f"{method} {url}: {answer['status']}",
                                data=_data(answer, attempt + 1))
    if waiting:
        return ModuleResult(Status.SKIPPED, f"check mode: {method} {url} not waited for "
                                            f"({problem}; a real run starts what it waits for)")
    return ModuleResult(Status.FAILED, f"{method} {url}: {problem} after {retries + 1} "
                                       f"attempt(s)", data=_data(answer, retries + 1))


def _send(request: Mapping[str, Any]) -> dict[str, Any]:
    data = request["body"].encode() if request["body"] is not None else None
    req = urllib.request.Request(request["url"], data=data, method=request["method"],
                                 headers=request["headers"])
    try:
        with urllib.request.urlopen(req, timeout=request["timeout"]) as resp:
            return {"status": resp.status, "body": resp.read().decode("utf-8", "replace")}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read().decode("utf-8", "replace")}
    except (urllib.error.URLError, OSError) as exc:
        return {"status": -1, "body": "", "error": str(getattr(exc, "reason", exc))}


def _send_remote(ctx: Any, request: Mapping[str, Any]) -> dict[str, Any]:
    # The script travels base64-encoded: shell words may not hold line breaks (quoting rules),
    # and stdin carries the request.
    script = base64.b64encode(_REMOTE.encode()).decode()
    loader = f"import base64; exec(base64.b64decode('{script}'))"
    result = ctx.conn.run(f"python3 -c {quote(loader)}", stdin=json.dumps(request),
                          timeout_s=float(request["timeout"]) + 30)
    try:
        return dict(json.loads(result.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"status": -1, "body": "", "error": (result.stderr or result.stdout)[-300:]}


def _judge(ctx: Any, answer: Mapping[str, Any], wanted: set[Any], contains: str | None,
           until: Any) -> str:
    if answer.get("status", -1) == -1:
        return f"no answer ({answer.get('error', 'unknown error')})"
    if until:
        parsed = _json(answer.get("body", ""))
        names = {"status": answer["status"], "body": answer["body"], "json": parsed}
        if ctx.test(until if isinstance(until, list) else str(until), names):
            return ""
        return f"until condition false (status {answer['status']})"
    if answer["status"] not in wanted:
        return f"status {answer['status']}, expected {sorted(wanted)}: {answer['body'][:300]}"
    if contains is not None and contains not in answer["body"]:
        return f"body does not contain {contains!r}: {answer['body'][:300]}"
    return ""


def _json(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _data(answer: Mapping[str, Any], attempts: int) -> dict[str, Any]:
    return {"status": answer.get("status"), "body": answer.get("body", "")[:4000],
            "json": _json(answer.get("body", "")), "attempts": attempts}
