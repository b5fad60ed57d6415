"""Helpers shared by lab test modules (not a test module itself)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PROVISION = str(Path(sys.executable).parent / "provision")


def provision(*args: str, state_home: Path | None = None, timeout: float | None = 600,
              approve: bool = True, stdin: int | None = None, cache_home: Path | None = None,
              env: Mapping[str, str | None] | None = None, cwd: Path | str | None = None,
              executable: str | Sequence[str] = PROVISION) -> subprocess.CompletedProcess[str]:
    """Run ``provision ARGS`` as an operator would, with the lab's environment; the one way lab
    tests run the CLI. Never raises on a non-zero exit (``subprocess.TimeoutExpired`` after
    ``timeout`` seconds, None: no limit); returns the finished process with text ``stdout``
    and ``stderr``.

    ``state_home``: the controller's state folder (``XDG_STATE_HOME``, where ``up`` keeps its
    records); without it each call gets its own empty temporary one, removed after the call.
    ``approve=False`` removes ``VLLM_PROVISION_YES`` (which the test session sets), so a run
    that needs approval asks (``stdin``: a terminal's file descriptor) or is refused.
    ``cache_home`` gives it its own ``XDG_CACHE_HOME`` (the stack sync's wheelhouse). ``env``:
    variables added to (or replacing) the session's environment; a None value removes one.
    ``cwd``: its working folder.
    ``executable``: what to run instead of this checkout's ``provision`` console script, as a
    path or an argv prefix (an installed wheel's ``provision``; ``[python, "-m", ...]``)."""
    if state_home is None and env is not None and env.get("XDG_STATE_HOME"):
        state_home = Path(str(env["XDG_STATE_HOME"]))
    if state_home is None:
        with tempfile.TemporaryDirectory(prefix="vp-state-") as temporary:
            return provision(*args, state_home=Path(temporary), timeout=timeout,
                             approve=approve, stdin=stdin, cache_home=cache_home, env=env,
                             cwd=cwd, executable=executable)
    merged = {**os.environ, **(env or {}), "XDG_STATE_HOME": str(state_home)}
    environ = {name: value for name, value in merged.items() if value is not None}
    if cache_home is not None:
        environ["XDG_CACHE_HOME"] = str(cache_home)
    if not approve:
        environ.pop("VLLM_PROVISION_YES", None)
    argv = [executable] if isinstance(executable, str) else list(executable)
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=timeout,
                          env=environ, check=False, stdin=stdin, cwd=cwd)


@contextlib.contextmanager
def own_inventory(replicas: Any, path: Path, state: Path,
                  **extra: Any) -> Iterator[dict[str, Any]]:
    """Hold the broker's lab hosts exclusively, from stopped, for a module that deploys an
    inventory of its own on them (``path``, with the controller state folder ``state``).

    Yields ``{"path", "state", "down": False, **extra}``; a test that takes the inventory's
    replicas down itself sets ``"down"`` True, else they are taken down (``provision down``)
    when the block ends. Either way the broker is told its replica is left down.
    """
    info = {"path": str(path), "state": state, "down": False, **extra}
    with replicas.exclusive("mp", start="stopped") as lease:
        try:
            yield info
        finally:
            if not info["down"]:
                provision("down", "-i", str(path), state_home=state, timeout=300)
            lease.leave("down")


def complete(base_url: str, model: str, timeout_s: float = 10) -> bool:
    """Send one real completion (4 tokens of "Hello") to ``base_url``; True when it answered
    200 with at least one choice, False on any HTTP, network or decoding failure."""
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(base_url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return bool(response.status == 200 and json.loads(response.read())["choices"])
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return False


def run_in_pty(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 600,
               columns: int = 160) -> tuple[int, bytes]:
    """Run ``argv`` with stdin, stdout and stderr on a new pseudo-terminal (``columns`` wide),
    as an operator's terminal; return the exit status and every byte it wrote (escape codes
    included). Killed (status -9) after ``timeout`` seconds."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                            close_fds=True, start_new_session=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end closed it
                break
            if not data:
                break
            out += data
        else:
            proc.kill()
    finally:
        os.close(master)
    return proc.wait(), bytes(out)


ANSI_ESCAPE = r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]"


def screen_text(raw: bytes) -> str:
    """What a terminal capture says with its escape codes (colours, cursor moves) removed."""
    import re

    return re.sub(ANSI_ESCAPE, "", raw.decode("utf-8", "replace")).replace("\r", "")


def shown_phases(text: str) -> list[str]:
    """The vLLM phase labels (``vllm_provision.output.phases.PHASES``) that a captured ``up`` or
    ``restart`` showed on its progress rows, in the order they first appear: the live rows
    (``  h1  7 s vllm.service active (running) loading weights``) and the plain ones
    (``[replica lab: waiting until rank 0 serves] h1 7 s ...: loading weights``)."""
    import re

    from vllm_provision.output.phases import PHASES

    seen: list[str] = []
    for line in text.splitlines():
        if not (re.match(r"^\s+h\d+\s+\d+ s\b", line)
                or re.match(r"^\[replica \S+: waiting until rank 0 serves\] ", line)):
            continue
        for label in PHASES:
            if label in line and label not in seen:
                seen.append(label)
    return seen


# --- The session's broker of deployed replicas (fixture ``replicas``, tests/lab/conftest.py) ---

STATES = ("serving", "down", "purged", "unknown")
# The extra arguments of a replica the broker found on the hosts but did not deploy itself.
UNNAMED_EXTRA = ("<extra arguments not known>",)
# Our units on a host without a state record (docs/deploy.md, "What `down --purge` removes").
DEFAULT_UNITS = ("vllm.service", "ray-head.service", "ray-worker.service", "vllm-watchdog.service")


@dataclass(frozen=True)
class Replica:
    """A replica of the lab that the broker handed out.

    Attributes:
        kind: the lab inventory it was deployed from (``"mp"`` or ``"ray"``).
        extra: the extra arguments its ``up`` was given (e.g. ``("-e", "vllm_api_key=...")``).
        inventory: the lab inventory's path, as a string for the CLI.
        state_home: its private controller state folder (``XDG_STATE_HOME``), holding the
            record of the ``up`` that deployed it; pass it to every run about this replica.
        base_url: rank 0's API (``http://<h1's address>:8000``).
        model: the model it serves (the lab's model path).
    """

    kind: str
    extra: tuple[str, ...]
    inventory: str
    state_home: Path
    base_url: str
    model: str = "/srv/models/lab-model"

    def provision(self, *args: str, **options: Any) -> subprocess.CompletedProcess[str]:
        """:func:`provision` with this replica's ``state_home`` (``options`` as there)."""
        return provision(*args, state_home=self.state_home, **options)


class Lease:
    """Exclusive use of the lab's replica hosts (``ReplicaBroker.exclusive``): ``replica`` is
    the replica as it was handed over, ``handed`` what the hosts then held (one of :data:`STATES`;
    a holder that changed nothing leaves ``lease.handed``); the holder says what it leaves with
    :meth:`leave`."""

    def __init__(self, replica: Replica, handed: str = "unknown") -> None:
        self.replica = replica
        self.handed = handed  # what the hosts held when handed over (one of STATES)
        self.left = "unknown"

    def leave(self, state: str) -> None:
        """Say what the hosts hold when the lease ends: ``"serving"`` (this replica, as
        deployed, serving), ``"down"`` (its units stopped), ``"purged"`` (nothing of ours) or
        ``"unknown"`` (the default, also when the holder raised); ValueError on another."""
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}; one of {STATES}")
        self.left = state


def hold_watchdogs(lab: Any, seconds: int = 600, hosts: Sequence[str] = ("h1", "h2")) -> None:
    """Hold the peer watchdogs of ``hosts`` for ``seconds`` (the hold file of docs/recovery.md,
    the role's default path), so that what follows is vLLM's and systemd's own behaviour;
    ``provision up`` and ``restart`` release the hold."""
    for host in hosts:
        held = lab.ssh(host, "mkdir -p /run/vllm-provision && echo $(( $(date +%s) + "
                             f"{int(seconds)} )) > /run/vllm-provision/watchdog.hold")
        assert held.returncode == 0, f"{host}: the hold file was not written: {held.stderr}"


class ReplicaBroker:
    """What is deployed on the session's lab hosts h1, h2 (both lab inventories use them), so
    that a module reuses a serving replica instead of deploying its own, and nobody purges
    defensively.

    The broker knows the hosts' state as one of :data:`STATES` with the replica's ``(kind,
    extra)``; it starts ``"unknown"`` (a lab reused from an earlier session may hold anything).
    An unknown state is named from the hosts when it can be (:meth:`_name`: the lab's own
    replica, down or serving); it purges only when it cannot name what is there. Modules that do
    not use the broker may change the hosts between two of its users, so before it acts on what
    it knows it checks cheaply that nobody deployed or purged since (each host's state record is
    the one it saw last: one ``sha256sum`` over SSH per host), and before it hands out a serving
    replica again that ``provision status`` says serving; when not, the state is unknown.

    ``log`` lists the broker's own runs (``"up mp"``, ``"down mp --purge"``), printed at the
    end of the session.
    """

    HOSTS = ("h1", "h2")
    RECORD = "/var/lib/vllm-provision/state.json"

    def __init__(self, lab: Any, root: Path) -> None:
        """``lab``: the session's ``vllm_provision_lab.Lab``; ``root``: an empty folder for the
        replicas' state folders (one per ``(kind, extra)``)."""
        self.lab = lab
        self.root = root
        self.state = "unknown"
        self.config: tuple[str, tuple[str, ...]] | None = None
        self.records: list[str] = []
        self.log: list[str] = []  # the broker's own runs, e.g. "up mp", for reports
        self.last_output = ""

    def replica(self, kind: str, extra: Sequence[str] = ()) -> Replica:
        """The :class:`Replica` for ``kind`` and ``extra`` (its state folder is made on first
        use); deploys nothing."""
        extra = tuple(extra)
        key = hashlib.sha256("\0".join([kind, *extra]).encode()).hexdigest()[:12]
        state_home = self.root / f"{kind}-{key}"
        state_home.mkdir(parents=True, exist_ok=True)
        address = next(h.address for h in self.lab.hosts if h.name == "h1")
        return Replica(kind, extra, str(self.lab.inventory_path(kind)), state_home,
                       f"http://{address}:8000")

    def serving(self, kind: str = "mp", extra: Sequence[str] = ()) -> Replica:
        """The lab's ``kind`` replica (deployed with ``extra``), serving, for a module that
        only reads it: reused when the broker knows it serving (and the check passes),
        else deployed. The holder must leave it as it found it. AssertionError when it
        cannot be deployed."""
        replica = self.replica(kind, extra)
        self._ensure(replica, "serving")
        return replica

    @contextlib.contextmanager
    def exclusive(self, kind: str = "mp", extra: Sequence[str] = (), start: str = "serving"
                  ) -> Iterator[Lease]:
        """Hand the hosts to a module that changes or breaks things, as a :class:`Lease`.

        ``start``: what the hosts hold when handed over: ``"serving"`` (the replica deployed
        and serving), ``"stopped"`` (not serving: down or purged, e.g. for an ``up`` that
        must start vLLM), ``"purged"`` (nothing of ours: a first install) or ``"any"``
        (nothing is done). When the ``with`` block ends, the broker takes the lease's
        :meth:`Lease.leave` as the hosts' state (``"unknown"`` when not said or on an error).
        """
        replica = self.replica(kind, extra)
        if start != "any":
            self._ensure(replica, start)
        lease = Lease(replica, self.state)
        self.state = "unknown"
        try:
            yield lease
        except (Exception, pytest.fail.Exception):
            self._stop_after_failure(replica)
            raise
        except BaseException:  # interrupted, or skipped: nothing is run
            self.state = "unknown"
            raise
        self.state, self.config = lease.left, (replica.kind, replica.extra)
        if self.state != "unknown":
            self.records = self._records()

    def stop_serving(self) -> None:
        """Before a lab module that does not use the broker: such a module expects no replica
        of ours serving on the hosts (as every module used to leave them), so the replica the
        broker left serving, if the hosts still hold it, is taken down (``down``). Anything
        else is left as it is (no purge)."""
        if self.state == "unknown":
            return
        if self._records() != self.records:
            self.state = "unknown"  # changed behind the broker's back: not ours to stop
        elif self.state == "serving":
            assert self.config is not None
            self._must(self.replica(self.config[0]), "down")
            self.state = "down"
            self.records = self._records()

    def _stop_after_failure(self, replica: Replica) -> None:
        """A lease ended by an error (a deploy that timed out, a failed test in the holder's
        fixture): ``provision down`` of the lease's replica, so that none of its processes
        (a Ray cluster half started, a vLLM unit crash-looping) runs on into the next module and
        fails it, which does not use the broker and only takes its own inventory down. The
        state is ``"down"`` when that worked, else unknown (the next user names it). Not a
        purge: what the replica installed stays for the next ``up``."""
        self.state = "unknown"
        try:
            if self._run(replica, "down"):
                self.state, self.config = "down", (replica.kind, replica.extra)
                self.records = self._records()
        except Exception as exc:  # noqa: BLE001 - the lease's own error is the one to report
            self.log.append(f"down after a failure did not finish: {exc!r}"[:200])

    def _records(self) -> list[str]:
        """Each host's state record digest ("" where it has none)."""
        return [self.lab.ssh(host, f"sha256sum {self.RECORD} 2>/dev/null").stdout
                for host in self.HOSTS]

    def _serves(self, replica: Replica) -> bool:
        """True when ``provision status`` says ``replica`` serves (exit 0)."""
        status = replica.provision("status", "-i", replica.inventory, *replica.extra,
                                   timeout=120)
        return status.returncode == 0

    def _run(self, replica: Replica, *args: str) -> bool:
        """Run ``provision ARGS[0] -i <replica's inventory> ARGS[1:] <its extra>``; True when
        it exited 0."""
        self.log.append(" ".join([args[0], replica.kind, *args[1:], *replica.extra]))
        run = replica.provision(args[0], "-i", replica.inventory, *args[1:], *replica.extra)
        self.last_output = run.stdout[-3000:] + run.stderr[-3000:]
        return run.returncode == 0

    def _must(self, replica: Replica, *args: str) -> None:
        """:meth:`_run` that must succeed: else the state is unknown and AssertionError."""
        if not self._run(replica, *args):
            self.state = "unknown"
            raise AssertionError(f"broker: provision {' '.join(args)} -i {replica.inventory} "
                                 f"failed:\n{self.last_output}")

    def _ensure(self, replica: Replica, want: str) -> None:
        """Bring the hosts to ``want`` (see :meth:`exclusive`) with as few runs as it can.

        What the broker knows is checked first: when a host's state record is not the one it
        saw last (a module outside the broker deployed or purged since), or a replica it
        knows serving does not, the state is unknown. When a step from a known state fails,
        the broker takes the state as unknown and tries once more from there."""
        if self.state != "unknown" and self._records() != self.records:
            self.state = "unknown"  # changed behind the broker's back
        if (self.state == "serving" and self.config == (replica.kind, replica.extra)
                and want == "serving" and not self._serves(replica)):
            self.state = "unknown"
        if self.state == "unknown":
            self._name()
        known = self.state != "unknown"
        try:
            self._step(replica, want)
        except AssertionError:
            if not known:
                raise
            self.state = "unknown"
            self._step(replica, want)
        self.records = self._records()

    def _name(self) -> None:
        """Name an unknown state from the hosts, changing nothing: ``"purged"`` when no file
        that the hosts' state records list (nor, without records, any of our default unit
        files or ``/etc/vllm-provision``) is left; ``"down"`` when none of the recorded units
        runs; ``"serving"`` when the records name a lab inventory and its ``provision status``
        says serving (with extra arguments the broker cannot know, so the next ``serving``
        runs ``up`` to converge). Else the state stays unknown."""
        records = []
        for host in self.HOSTS:
            text = self.lab.ssh(host, f"cat {self.RECORD} 2>/dev/null").stdout
            try:
                record = json.loads(text) if text.strip() else None
            except ValueError:
                return
            records.append(record)
        kinds = {str(self.lab.inventory_path(kind)): kind for kind in ("mp", "ray")}
        inventories = {str(r.get("inventory")) for r in records if isinstance(r, dict)}
        kind = kinds.get(inventories.pop()) if len(inventories) == 1 else None
        left, running = False, False
        for host, record in zip(self.HOSTS, records, strict=True):
            entry = (record or {}).get("hosts", {}).get(host, {}) if record else {}
            files = set(entry.get("files", {})) | {"/etc/vllm-provision"}
            units = set(entry.get("units", [])) | set(entry.get("started_from", {}))
            if record is None:
                files |= {f"/etc/systemd/system/{unit}" for unit in DEFAULT_UNITS}
                units |= set(DEFAULT_UNITS)
            probe = "; ".join([f"test -e {shlex.quote(f)} && echo file" for f in sorted(files)]
                              + [f"systemctl is-active --quiet {shlex.quote(u)} && echo unit"
                                 for u in sorted(units)] + ["true"])
            out = self.lab.ssh(host, probe).stdout.split()
            left, running = left or "file" in out, running or "unit" in out
        config = (kind, UNNAMED_EXTRA) if kind else None
        if not left:
            self.state, self.config = "purged", None
        elif not running:
            self.state, self.config = "down", config
        elif kind is not None:
            status = provision("status", "-i", str(self.lab.inventory_path(kind)), timeout=120)
            if status.returncode == 0:
                self.state, self.config = "serving", config
        self.log.append(f"named: {self.state}")

    def _step(self, replica: Replica, want: str) -> None:
        """The runs from the known state to ``want``; AssertionError when one fails."""
        config = (replica.kind, replica.extra)
        if self.state == "unknown":
            # The one purge: what is there cannot be named. Another inventory may own the
            # hosts (a module that does not use the broker): take them over first.
            if not self._run(replica, "down", "--purge"):
                self._must(replica, "up", "--take-over")
                self._must(replica, "down", "--purge")
            self.state, self.config = "purged", None
        # the replica on the hosts, named by its inventory (down and purge need no extras)
        owner = self.replica(self.config[0]) if self.config is not None else replica
        if want == "purged" and self.state != "purged":
            self._must(owner, "down", "--purge")
            self.state, self.config = "purged", None
        elif want == "stopped" and self.state == "serving":
            self._must(owner, "down")
            self.state = "down"
        elif want == "serving" and not (self.state == "serving" and self.config == config):
            # another inventory's replica that serves owns the hosts (a down one hands them back)
            other = (self.state == "serving" and self.config is not None
                     and self.config[0] != replica.kind)
            self._must(replica, "up", *(("--take-over",) if other else ()))
            self.state, self.config = "serving", config
