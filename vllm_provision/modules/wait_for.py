"""Wait until a TCP port is open (or closed), probed from the host or from the controller.

Arguments:
    port: TCP port (1-65535), required.
    host: address to probe (default: the target host's own address when probing from the
        controller, ``127.0.0.1`` when probing on the host).
    state: ``started`` (open, default) or ``stopped`` (closed).
    timeout: seconds to wait in all (default 300). delay: seconds before the first probe.
    connect_timeout: seconds per probe (default 5, Ansible's).
    from: ``host`` (default, like Ansible's wait_for: bash ``/dev/tcp`` on the target, one round
        trip for the whole wait) or ``controller``.

``ok`` when the port reached the state (nothing was changed); ``failed`` on timeout; ``skipped``
in check mode, which never waits (the real run starts what a playbook waits for). Example::

    - name: Wait for the master's TCP store
      wait_for: {port: 29501, host: "{{ replica.master_addr }}", timeout: 120}
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from vllm_provision.connection import probe_tcp
from vllm_provision.errors import ProvisionError
from vllm_provision.kinds import check_ssh_host
from vllm_provision.modules import ModuleResult, check_arguments, check_type, quote, require
from vllm_provision.results import Status

ARGUMENTS = ("port", "host", "state", "timeout", "delay", "connect_timeout", "from")
_POLL_S = 1.0


def run(ctx: Any, args: Mapping[str, Any]) -> ModuleResult:
    """Wait for the port; see the module docstring.

    Raises:
        ProvisionError: bad arguments. UnreachableError: the connection failed.
    """
    check_arguments(args, ARGUMENTS, "wait_for")
    port = require(args, "port", "wait_for", int)
    if not 1 <= port <= 65535:
        raise ProvisionError.single("wait_for: port", "out of range", expected="1-65535",
                                    actual=str(port))
    state = check_type(args, "state", "wait_for", str) or "started"
    if state not in ("started", "stopped"):
        raise ProvisionError.single("wait_for: state", "invalid state",
                                    expected="started or stopped", actual=state)
    timeout = float(check_type(args, "timeout", "wait_for", (int, float)) or 300)
    delay = float(check_type(args, "delay", "wait_for", (int, float)) or 0)
    per_probe = float(check_type(args, "connect_timeout", "wait_for", (int, float)) or 5)
    origin = check_type(args, "from", "wait_for", str) or "host"
    if origin not in ("host", "controller"):
        raise ProvisionError.single("wait_for: from", "invalid origin",
                                    expected="host or controller", actual=origin)
    address = check_type(args, "host", "wait_for", str) or (
        ctx.host.address if origin == "controller" else "127.0.0.1")
    wrong = check_ssh_host(address)
    if wrong is not None:
        raise ProvisionError.single("wait_for: host", "invalid address", expected=wrong,
                                    actual=repr(address), fix="give an IP address or host name")
    if ctx.check_mode:
        # A port a playbook waits for is opened (or closed) by the units a real run starts;
        # check mode starts none, so waiting would only burn the whole timeout.
        return ModuleResult(Status.SKIPPED, f"check mode: {address}:{port} not waited for (a "
                                            "real run starts what it waits for)")
    want_open = state == "started"
    if origin == "controller":
        time.sleep(delay)
        deadline = time.monotonic() + timeout
        while True:
            is_open = probe_tcp(address, port, per_probe)
            if is_open == want_open:
                return _reached(address, port, state)
            if time.monotonic() >= deadline:
                return _timed_out(address, port, state, timeout)
            time.sleep(_POLL_S)
    wanted = "0" if want_open else "1"
    script = (
        f"sleep {delay:g}; end=$(( $(date +%s) + {int(timeout)} )); "
        f"while :; do "
        # the address is its own argv word ($1 of the inner bash), never part of its script
        f"if timeout {per_probe:g} bash -c 'exec 3<>\"/dev/tcp/$1/$2\"' wait_for "
        f"{quote(address)} {port} "
        f"2>/dev/null; then r=0; else r=1; fi; "
        f"[ $r = {wanted} ] && exit 0; "
        f"[ $(date +%s) -ge $end ] && exit 3; sleep {_POLL_S:g}; done"
    )
    result = ctx.conn.run(script, timeout_s=delay + timeout + per_probe + 30)
    if result.ok:
        return _reached(address, port, state)
    if result.exit_code == 3:
        return _timed_out(address, port, state, timeout)
    return ModuleResult(Status.FAILED, f"probe failed: {(result.stderr or result.stdout)[-500:]}")


def _reached(address: str, port: int, state: str) -> ModuleResult:
    word = "open" if state == "started" else "closed"
    return ModuleResult(Status.OK, f"{address}:{port} is {word}",
                        data={"host": address, "port": port, "state": state})


def _timed_out(address: str, port: int, state: str, timeout: float) -> ModuleResult:
    word = "open" if state == "started" else "close"
    return ModuleResult(Status.FAILED, f"{address}:{port} did not {word} within {timeout:g} s",
                        data={"host": address, "port": port, "state": state})
