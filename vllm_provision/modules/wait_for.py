"""Wait until a TCP port is open (or closed), probed from the host or from the controller.

From the host (the default, like Ansible's wait_for) the probe is bash's ``/dev/tcp`` on the
target, one round trip for the whole wait. Its first probe alone is a read a batch may carry
(:func:`read_command`): when the batch holds its answer and the port is already in the state
waited for, no command of its own is sent; otherwise the wait runs on the host as usual.

``ok`` when the port reached the state (nothing was changed); ``failed`` on timeout; ``skipped``
in check mode, which never waits (the real run starts what a playbook waits for). Example::

    - name: Wait for the master's TCP store
      wait_for: {port: 29501, host: "{{ replica.master_addr }}", timeout: 120}
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.results import Status
from vllm_provision.modules import ModuleResult, quote
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext
from vllm_provision.settings.kinds import check_ssh_host
from vllm_provision.transport.connection import probe_tcp

ARGUMENT_SPEC = ArgumentSpec("wait_for", (
    Argument("port", "int", "TCP port", required=True, minimum=1, maximum=65535),
    Argument("host", "str", "address to probe",
             default_text="the host's own address from the controller, 127.0.0.1 on the host"),
    Argument("state", "str", "started: open; stopped: closed", default="started",
             choices=("started", "stopped")),
    Argument("timeout", "float", "seconds to wait in all", default=300.0, minimum=0),
    Argument("delay", "float", "seconds before the first probe", default=0.0, minimum=0),
    Argument("connect_timeout", "float", "seconds per probe (Ansible's default)", default=5.0,
             minimum=0.1),
    Argument("from", "str", "where the probe runs", default="host",
             choices=("host", "controller")),
))
_POLL_S = 1.0


def _probe(address: str, port: int, per_probe: float, want_open: bool) -> str:
    """One probe of ``address:port`` from the host: exit 0 when the port is in the state
    waited for, 1 otherwise (the address is its own argv word, never part of a script)."""
    return (f"if timeout {per_probe:g} bash -c 'exec 3<>\"/dev/tcp/$1/$2\"' wait_for "
            f"{quote(address)} {port} 2>/dev/null; then r=0; else r=1; fi; "
            f"[ $r = {'0' if want_open else '1'} ]")


def read_command(ctx: ModuleContext, args: Any) -> str | None:
    """One probe (:func:`_probe`), the read a batch may carry (the module read protocol,
    vllm_provision.modules, "read_command"); None from the controller, with a ``delay``, in
    check mode, or for arguments that do not validate (``run`` reports those)."""
    try:
        values = ARGUMENT_SPEC.validate(args)
    except ProvisionError:
        return None
    if values["from"] != "host" or float(values["delay"]) > 0 or ctx.check_mode:
        return None
    address = values["host"] or "127.0.0.1"
    if check_ssh_host(address) is not None:
        return None
    return _probe(address, values["port"], float(values["connect_timeout"]),
                  values["state"] == "started")


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Wait for the port; see the module docstring.

    Raises:
        ProvisionError: bad arguments. UnreachableError: the connection failed.
    """
    values = ARGUMENT_SPEC.validate(args)
    port, state, origin = values["port"], values["state"], values["from"]
    timeout, delay = float(values["timeout"]), float(values["delay"])
    per_probe = float(values["connect_timeout"])
    address = values["host"] or (ctx.host.address if origin == "controller" else "127.0.0.1")
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
    probe = _probe(address, port, per_probe, want_open)
    holds = getattr(ctx.conn, "holds", None)
    if delay == 0 and holds is not None and holds([probe]) and ctx.conn.run(probe).ok:
        return _reached(address, port, state)  # the batch's answer: already there
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
