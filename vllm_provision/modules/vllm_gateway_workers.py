"""Put back every worker of the front door's unit that its running router lacks.

The router's worker list lives in its process: ``POST /remove_worker`` (``provision upgrade``'s
drain, or an operator) takes a worker out until the router restarts or is told
``POST /add_worker``, and ``up`` leaves an unchanged unit's router running. This module reads
the router's ``GET /workers`` on the gateway host and adds each worker of ``workers`` (the
unit's ``--worker-urls``) it lacks, so an upgrade cut short between its drain and its undrain is
mended by the next ``up`` without a restart of the router (docs/front-door.md).

The requests are made by ``python3`` (urllib) on the host, one round trip; the worker URLs
travel as JSON on stdin and are percent-encoded as query values there, never pasted into a
command line. vllm-router 0.1.17 answers an addition once the worker passes its health check
(``timeout`` bounds the wait; giving up cancels it). A worker that does not become healthy in
time is named in the message and ``data.not_added`` but does not fail the task: a replica that
does not serve already fails its own wait, and an upgrade's batch must not fail a good
replica's node over another's.

It runs right after the router's start, before the readiness wait (a router holding no worker
is never ready), so it waits up to ``wait`` seconds for a router that does not answer yet.

``changed`` when it added a worker (in check mode: when one is missing, nothing sent); ``ok``
when none was missing; ``failed`` when the router did not answer ``GET /workers`` (``skipped``
in check mode). Example::

    - name: Put back the workers the running router lacks
      vllm_gateway_workers: {url: "{{ gateway.local_url }}", workers: "{{ gateway.workers }}"}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vllm_provision.core import hostjson
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.quoting import python_loader
from vllm_provision.core.results import Status
from vllm_provision.modules import ModuleResult, quote
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext

ARGUMENT_SPEC = ArgumentSpec("vllm_gateway_workers", (
    Argument("url", "str", "the router's base URL on the host (gateway.local_url)",
             required=True),
    Argument("workers", "list", "every worker URL the router should hold (gateway.workers)",
             required=True),
    Argument("timeout", "float", "seconds one addition may wait for the worker's health check",
             default=20.0, minimum=1),
    Argument("wait", "float", "seconds to wait for a router that does not answer yet (just "
             "started); none in check mode", default=120.0, minimum=0),
))

_SCRIPT = r"""
import json, sys, urllib.error, urllib.parse, urllib.request
req = json.loads(sys.stdin.read())
def call(method, path, timeout, url=None):
    target = req["url"] + path + ("?" + urllib.parse.urlencode({"url": url}) if url else "")
    r = urllib.request.Request(target, data=b"" if method == "POST" else None, method=method)
    try:
        with urllib.request.urlopen(r, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except Exception as e:
        return -1, str(e)
import time
deadline = time.monotonic() + req["wait"]
while True:  # a router just started listens once its workers answer: wait for it
    status, body = call("GET", "/workers", 10)
    if status != -1 or time.monotonic() >= deadline:
        break
    time.sleep(1)
out = {"status": status, "body": body[:300], "missing": [], "added": [], "not_added": {}}
if status == 200:
    try:
        held = [w.get("url") for w in json.loads(body)["workers"]]
    except Exception as e:
        out["status"], out["body"] = -1, "unknown answer: " + body[:200]
        held = None
    if held is not None:
        out["missing"] = [w for w in req["workers"] if w not in held]
        for worker in out["missing"] if not req["check"] else []:
            code, text = call("POST", "/add_worker", req["timeout"], worker)
            if code == 200 or (code == 400 and "already exists" in text):
                out["added"].append(worker)
            else:
                out["not_added"][worker] = "HTTP %s: %s" % (code, " ".join(text.split())[:200])
print(json.dumps(out))
"""


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Read the router's workers and add the missing ones; see the module docstring.

    Raises:
        ProvisionError: bad arguments. UnreachableError: the connection failed.
    """
    values = ARGUMENT_SPEC.validate(args)
    url, workers = str(values["url"]), [str(w) for w in values["workers"]]
    if not url.startswith(("http://", "https://")):
        raise ProvisionError.single("vllm_gateway_workers: url", "not an http(s) URL",
                                    actual=url, fix="give gateway.local_url")
    timeout = float(values["timeout"])
    loader = python_loader(_SCRIPT)
    wait = 0.0 if ctx.check_mode else float(values["wait"])
    request = {"url": url.rstrip("/"), "workers": workers, "timeout": timeout,
               "check": ctx.check_mode, "wait": wait}
    result = ctx.conn.run(f"python3 -c {quote(loader)}", stdin=json.dumps(request),
                          timeout_s=30 + wait + timeout * max(1, len(workers)))
    try:
        answer = dict(hostjson.loads(result.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return ModuleResult(Status.FAILED, f"{ctx.host.name}: the router check did not run: "
                            + " ".join((result.stderr or result.stdout).split())[-300:])
    if answer.get("status") != 200:
        what = (f"the front door at {url} on {ctx.host.name} did not answer GET /workers "
                f"(status {answer.get('status')}: {answer.get('body', '')})")
        if ctx.check_mode:
            return ModuleResult(Status.SKIPPED, f"check mode: {what}")
        return ModuleResult(Status.FAILED, what)
    missing, added = list(answer["missing"]), list(answer["added"])
    not_added = dict(answer["not_added"])
    data = {"missing": missing, "added": added, "not_added": not_added}
    if not missing:
        return ModuleResult(Status.OK, f"the router holds all {len(workers)} worker(s)",
                            data=data)
    if ctx.check_mode:
        return ModuleResult(Status.CHANGED, "would add " + ", ".join(missing), data=data)
    message = ("added " + ", ".join(added) if added else "added none")
    if not_added:
        message += "; not added (not healthy in time): " + "; ".join(
            f"{w}: {why}" for w, why in not_added.items())
    return ModuleResult(Status.CHANGED if added else Status.OK, message, data=data)
