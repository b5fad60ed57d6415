"""Make an HTTP request and check the answer, retrying until a condition holds.

A mapping or list ``body`` is sent as JSON (``body_format`` defaults to ``json`` then). With
``from: host`` the request is made by ``python3`` (urllib) on the target, one round trip per
attempt; a GET or HEAD without headers or body travels on the command line, so the play's read
batch carries its first attempt (others go on stdin, which keeps a header's key out of the
host's process list).

Reports ``ok`` on success (a request changes nothing we track) and ``failed`` with the last
status and body otherwise. Not sent in check mode for methods other than GET/HEAD (``skipped``).
Example::

    - name: Wait until vLLM answers
      http: {url: "http://{{ node.host_ip }}:8000/health", until: "status == 200",
             retries: 60, delay: 5}
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from vllm_provision.core import hostjson
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.quoting import python_loader
from vllm_provision.core.results import Status
from vllm_provision.modules import ModuleResult, quote
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext

ARGUMENT_SPEC = ArgumentSpec("http", (
    Argument("url", "str", "http:// or https:// URL", required=True),
    Argument("method", "str", "HTTP verb (GET, POST, ...)", default="GET"),
    Argument("body", "raw", "request body: a string, or a mapping/list sent as JSON"),
    Argument("body_format", "str", "how the body is sent",
             default_text="json for a mapping or list, else raw", choices=("json", "raw")),
    Argument("headers", "dict", "request headers"),
    Argument("timeout", "float", "seconds per request", default=10.0, minimum=0.1),
    Argument("status_code", ("int", "list"), "wanted status, or a list of them", default=200),
    Argument("body_contains", "str", "text the body must contain"),
    Argument("until", ("str", "list"), "Jinja2 condition over the answer (status, body, json), "
             "retried until true"),
    Argument("retries", "int", "extra attempts", default_text="0; 3 with until (Ansible's)",
             minimum=0),
    Argument("delay", "float", "seconds between attempts", default=5.0, minimum=0),
    Argument("from", "str", "where the request is made", default="controller",
             choices=("controller", "host")),
))

_REMOTE = r"""
import json, sys, urllib.request, urllib.error
req = json.loads(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read())
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


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Send the request (with retries); see the module docstring.

    Raises:
        ProvisionError: bad arguments. UnreachableError: the connection failed (``from: host``).
    """
    values = ARGUMENT_SPEC.validate(args)
    url = values["url"]
    if not url.startswith(("http://", "https://")):
        raise ProvisionError.single("http: url", "not an http(s) URL", actual=url)
    request = _request(values)
    method = request["method"]
    wanted = values["status_code"]
    wanted_codes = set(wanted) if isinstance(wanted, list) else {wanted}
    contains = values["body_contains"]
    until = values["until"]
    retries = values["retries"]
    retries = (3 if until else 0) if retries is None else retries
    delay = values["delay"]
    origin = values["from"]
    if ctx.check_mode and method not in ("GET", "HEAD"):
        return ModuleResult(Status.SKIPPED, f"{method} not sent in check mode")
    # Check mode never waits: what a retried request waits for (a server coming up, a watchdog
    # released) is started by the real run, which check mode does not do. One request answers
    # "is it already so"; anything else is reported as not waited for.
    waiting = ctx.check_mode and retries > 0
    if waiting:
        retries = 0
    answer: dict[str, Any] = {}
    problem = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(delay)
        answer = (_send_remote(ctx, request, again=attempt > 0) if origin == "host"
                  else _send(request))
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


def _inline(request: Mapping[str, Any]) -> bool:
    """Whether the request may ride on the command line: a GET or HEAD without headers or body
    (nothing secret in it), which a batch of reads can then carry (:func:`read_command`)."""
    return (request["method"] in ("GET", "HEAD") and not request["headers"]
            and request["body"] is None)


def _remote_command(request: Mapping[str, Any]) -> str:
    """``python3 -c <loader>`` with the request as one quoted JSON word when it is
    :func:`_inline`, else the bare command (the request then goes on stdin: headers may hold a
    key, which must not show in the host's process list)."""
    # The script travels base64-encoded: shell words may not hold line breaks (quoting rules).
    command = f"python3 -c {quote(python_loader(_REMOTE))}"
    if _inline(request):
        command += " " + quote(json.dumps(dict(request), sort_keys=True,
                                          separators=(",", ":")))
    return command


def _request(values: Mapping[str, Any]) -> dict[str, Any]:
    """The request :func:`run` sends, from validated arguments."""
    body = values["body"]
    body_format = values["body_format"] or (
        "json" if isinstance(body, (Mapping, list)) else "raw")
    headers = dict(values["headers"] or {})
    if body is not None and body_format == "json":
        body = json.dumps(body)
        headers.setdefault("Content-Type", "application/json")
    elif body is not None:
        body = str(body)
    return {"url": values["url"], "method": values["method"].upper(), "body": body,
            "headers": headers, "timeout": values["timeout"]}


def read_command(ctx: ModuleContext, args: Mapping[str, Any]) -> str | None:
    """The first request's command, for the play's read batch (vllm_provision.modules,
    "read_command"): only ``from: host`` GET/HEAD requests without headers or body; None
    otherwise (sent from the controller, or on stdin).

    Raises:
        ProvisionError: bad arguments (the runner then leaves the task to run live).
    """
    values = ARGUMENT_SPEC.validate(args)
    if values["from"] != "host" or not values["url"].startswith(("http://", "https://")):
        return None
    request = _request(values)
    return _remote_command(request) if _inline(request) else None


def _send_remote(ctx: ModuleContext, request: Mapping[str, Any], *,
                 again: bool = False) -> dict[str, Any]:
    """Make the request on the host. ``again``: a retry, which must reach the host: a command
    with stdin is never answered from the play's read batch (runner/prefetch.py), so an inline
    request gets an empty stdin (the script reads its argument, not stdin)."""
    command = _remote_command(request)
    stdin = json.dumps(request) if not _inline(request) else ("" if again else None)
    result = ctx.conn.run(command, stdin=stdin, timeout_s=float(request["timeout"]) + 30)
    try:
        return dict(hostjson.loads(result.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"status": -1, "body": "", "error": (result.stderr or result.stdout)[-300:]}


def _judge(ctx: ModuleContext, answer: Mapping[str, Any], wanted: set[Any], contains: str | None,
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
        return hostjson.loads(body)
    except ValueError:
        return None


def _data(answer: Mapping[str, Any], attempts: int) -> dict[str, Any]:
    return {"status": answer.get("status"), "body": answer.get("body", "")[:4000],
            "json": _json(answer.get("body", "")), "attempts": attempts}
