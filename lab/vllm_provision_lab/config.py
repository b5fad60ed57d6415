"""Settings of one lab instance (names, addresses, directories), read from the environment."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from vllm_provision_lab.errors import LabError

DEFAULT_STATE_DIR = Path("/var/lib/vllm-provision/lab")
DEFAULT_NAME = "vp"
DEFAULT_NET = "10.213.0"
MAX_HOSTS = 64

# Linux interface names are at most 15 bytes (IFNAMSIZ 16 incl. NUL, include/uapi/linux/if.h);
# the longest names we make are "<name>-h64" and "<name>br0", so the name gets at most 10.
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")
_NET_RE = re.compile(r"^(\d{1,3})\.(\d{1,3})\.(\d{1,3})$")


@dataclass(frozen=True)
class LabConfig:
    """Where one lab instance keeps its state and how its kernel objects are named.

    Attributes:
        state_dir: the instance's state dir (key, known_hosts, ssh_config, inventories, host dirs).
        name: the instance prefix: netns and host-side veth ``<name>-h1``, bridge ``<name>br0``,
            cgroup subtree ``vllm-provision-<name>/h1``.
        net: the /24 prefix (three octets, ``10.213.0``): bridge ``.1``, host hN ``.(10+N)``.
        cache_dir: where built base images are cached (tarballs); may be shared by instances.
        nice: the scheduling niceness (-20 to 19, nice(1)) every process of the instance's
            hosts starts with: the boot loop sets it before it starts systemd-nspawn, and the
            guest's systemd, services and SSH sessions inherit it (systemd changes it only for
            a unit with ``Nice=``, systemd.exec(5)). 0 (the default) leaves it as it is. On a
            machine that runs several instances, a lower value for the instance whose tests have
            timing windows gives its processes more of the CPUs when all want them
            (docs/testing.md, "CPU shares").
    """

    state_dir: Path = DEFAULT_STATE_DIR
    name: str = DEFAULT_NAME
    net: str = DEFAULT_NET
    cache_dir: Path | None = None
    nice: int = 0

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise LabError.single(
                "VLLM_PROVISION_LAB_NAME", "the instance name cannot be used in interface names",
                expected="1-10 lower-case letters or digits, starting with a letter",
                actual=self.name, fix="export VLLM_PROVISION_LAB_NAME=t1 (for example)")
        match = _NET_RE.match(self.net)
        if not match or any(int(octet) > 255 for octet in match.groups()):
            raise LabError.single(
                "VLLM_PROVISION_LAB_NET", "the lab network is not a /24 prefix",
                expected="three octets such as 10.213.0", actual=self.net,
                fix="export VLLM_PROVISION_LAB_NET=10.213.1 (for example)")
        if not self.state_dir.is_absolute():
            raise LabError.single(
                "VLLM_PROVISION_LAB_DIR", "the lab state dir must be an absolute path",
                actual=str(self.state_dir), fix="export VLLM_PROVISION_LAB_DIR=/var/lib/...")
        if not -20 <= self.nice <= 19:
            raise LabError.single(
                "VLLM_PROVISION_LAB_NICE", "the niceness is out of range",
                expected="an integer from -20 to 19 (nice(1))", actual=str(self.nice),
                fix="export VLLM_PROVISION_LAB_NICE=-5 (for example), or unset it")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> LabConfig:
        """Read ``VLLM_PROVISION_LAB_{DIR,NAME,NET,CACHE,NICE}`` (docs/architecture.md, "Lab
        instances").

        Raises:
            LabError: a value cannot be used (bad name, network, relative path, or a niceness
                that is not an integer from -20 to 19).
        """
        env = os.environ if environ is None else environ
        state_dir = Path(env.get("VLLM_PROVISION_LAB_DIR") or DEFAULT_STATE_DIR)
        cache = env.get("VLLM_PROVISION_LAB_CACHE")
        nice = (env.get("VLLM_PROVISION_LAB_NICE") or "0").strip()
        if not re.fullmatch(r"[+-]?\d{1,2}", nice):
            raise LabError.single(
                "VLLM_PROVISION_LAB_NICE", "the niceness is not an integer",
                expected="an integer from -20 to 19 (nice(1))", actual=nice,
                fix="export VLLM_PROVISION_LAB_NICE=-5 (for example), or unset it")
        return cls(state_dir=state_dir, name=env.get("VLLM_PROVISION_LAB_NAME") or DEFAULT_NAME,
                   net=env.get("VLLM_PROVISION_LAB_NET") or DEFAULT_NET,
                   cache_dir=Path(cache) if cache else None, nice=int(nice))

    def environ(self) -> dict[str, str]:
        """The ``VLLM_PROVISION_LAB_*`` variables that select this instance (for a child
        process, or ``os.environ.update``): the inverse of :meth:`from_env`."""
        return {"VLLM_PROVISION_LAB_DIR": str(self.state_dir),
                "VLLM_PROVISION_LAB_NAME": self.name, "VLLM_PROVISION_LAB_NET": self.net,
                "VLLM_PROVISION_LAB_CACHE": str(self.cache),
                "VLLM_PROVISION_LAB_NICE": str(self.nice)}

    def worker(self, index: int) -> LabConfig:
        """The instance of test worker ``index`` (0, 1, ...; pytest-xdist's ``gw<index>``)
        beside this one: name ``<name>w<index>`` (the name cut to fit 10 characters), the
        ``index + 1``-th /24 after this one (``10.213.0`` -> worker 0 on ``10.213.1``), state dir
        ``<state_dir>-w<index>``, and this instance's base cache, shared (docs/testing.md); the
        niceness is this instance's.

        Raises:
            LabError: a negative index, or a /24 past ``.255``.
        """
        if index < 0:
            raise LabError.single("worker", "a worker index is 0 or more", actual=str(index))
        first, second, third = self.net.split(".")
        if int(third) + 1 + index > 255:
            raise LabError.single(
                "VLLM_PROVISION_LAB_NET", f"worker {index} has no /24 left after {self.net}",
                expected=f"a third octet of at most {254 - index}", actual=self.net,
                fix="export VLLM_PROVISION_LAB_NET=10.213.0 (for example)")
        suffix = f"w{index}"
        return LabConfig(state_dir=Path(f"{self.state_dir}-{suffix}"),
                         name=self.name[:10 - len(suffix)] + suffix,
                         net=f"{first}.{second}.{int(third) + 1 + index}",
                         cache_dir=self.cache, nice=self.nice)

    @property
    def cache(self) -> Path:
        """The base-image cache dir: ``VLLM_PROVISION_LAB_CACHE`` or ``<state_dir>/cache``."""
        return self.cache_dir if self.cache_dir is not None else self.state_dir / "cache"

    @property
    def bridge(self) -> str:
        """The bridge name on the main machine (``vpbr0``)."""
        return f"{self.name}br0"

    @property
    def bridge_address(self) -> str:
        """The main machine's address on the bridge (``10.213.0.1``)."""
        return f"{self.net}.1"

    @property
    def cgroup_subtree(self) -> str:
        """The cgroup dir (relative to a hierarchy root) holding one cgroup per host."""
        return f"vllm-provision-{self.name}"

    @property
    def run_dir(self) -> Path:
        """Per-host dirs (overlay upper/work/root, pid files, console log) live here."""
        return self.state_dir / "run"

    def netns(self, host: str) -> str:
        """The network namespace of ``host`` (``vp-h1``); the host-side veth has the same name."""
        return f"{self.name}-{host}"

    def address(self, host: str) -> str:
        """The fixed address of ``host`` ("h3" -> ``10.213.0.13``).

        Raises:
            LabError: ``host`` is not ``h1`` .. ``h64``.
        """
        return f"{self.net}.{10 + host_index(host)}"

    def host_named(self, word: str) -> str:
        """The host name for ``word``: a host name as it is, or a host's address in this
        instance's /24 (``10.213.0.12`` -> ``h2``), as ``provision fault --partition-command``
        appends it.

        Raises:
            LabError: neither a lab host name nor an address of this instance's hosts.
        """
        prefix = f"{self.net}."
        if word.startswith(prefix) and word[len(prefix):].isdigit():
            word = f"h{int(word[len(prefix):]) - 10}"
        host_index(word)
        return word


def host_index(host: str) -> int:
    """Return N for a lab host name ``hN`` (1..64).

    Raises:
        LabError: the name is not ``h1`` .. ``h64``.
    """
    match = re.fullmatch(r"h([1-9][0-9]?)", host)
    if not match or int(match.group(1)) > MAX_HOSTS:
        raise LabError.single(host, "is not a lab host name", expected=f"h1 .. h{MAX_HOSTS}",
                              actual=host, fix="run `provision lab status` to list the hosts")
    return int(match.group(1))


def host_names(count: int) -> list[str]:
    """Return ``["h1", ..., "h<count>"]``.

    Raises:
        LabError: ``count`` is not 1..64.
    """
    if not 1 <= count <= MAX_HOSTS:
        raise LabError.single("--hosts", "the lab cannot boot that many hosts",
                              expected=f"1 to {MAX_HOSTS}", actual=str(count))
    return [f"h{i}" for i in range(1, count + 1)]
