"""Make the venv report the host spec's versions: regenerate everything derived from spec.json.

Run in the guest by ``provision lab set`` (``PYTHONPATH=<site-packages> python3 -m
vllm_lab_standin.apply``) and on the controller by ``prepare_host`` (with ``root`` = the host's
overlay root). Standard library only.

* ``vllm``, ``torch`` (``2.14.0+cu130``), ``nvidia-nccl-cu13``/``-cu12``, ``transformers``:
  dist-info directories holding METADATA/INSTALLER/RECORD, so ``importlib.metadata.version()``
  reports them (stale ones of another version are removed).
* ``ray`` is real: when the spec's version differs, the host's copy of the ray dist-info METADATA
  and ``ray/_version.py`` are patched, so Ray itself reports it (a real Ray version mismatch).
* ``python``: ``vllm_lab_python.pth`` imports :mod:`vllm_lab_standin.pyversion` at interpreter
  start; it rewrites ``sys.version``/``sys.version_info`` only when the spec names a version.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any

STANDIN_DISTRIBUTIONS = ("vllm", "torch", "nvidia_nccl_cu12", "nvidia_nccl_cu13", "transformers")
PTH_NAME = "vllm_lab_python.pth"


def distributions(spec: dict[str, Any]) -> dict[str, str]:
    """Return ``{distribution name: version}`` the venv must report for ``spec``."""
    cuda_major = str(spec["cuda"]).split(".")[0]
    nccl = "nvidia-nccl-cu12" if cuda_major == "12" else "nvidia-nccl-cu13"
    return {"vllm": str(spec["vllm"]), "torch": f"{spec['torch']}+{spec['torch_cuda']}",
            nccl: str(spec["nccl"]), "transformers": str(spec["transformers"])}


def write_dist_info(site: Path, name: str, version: str) -> Path:
    """Write ``<name>-<version>.dist-info`` (PEP 376/566) into ``site``; return the folder."""
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        "Summary: vllm-provision lab stand-in metadata (no code installed)\n", encoding="utf-8")
    (folder / "INSTALLER").write_text("vllm-provision-lab\n", encoding="utf-8")
    (folder / "RECORD").write_text("", encoding="utf-8")
    return folder


def patch_ray_version(site: Path, version: str | None) -> None:
    """Make the real ray report ``version`` (dist-info METADATA and ``ray/_version.py``).

    The real version is kept in ``ray/_lab_real_version`` before the first patch, and
    ``version=None`` (the spec's default) puts it back.
    """
    version_py = site / "ray" / "_version.py"
    real_file = site / "ray" / "_lab_real_version"
    if not version_py.exists():
        return
    current = re.search(r'(?m)^version = "(.*)"$', version_py.read_text(encoding="utf-8"))
    if not real_file.exists():
        if version is None:
            return
        real_file.write_text(current.group(1) if current else "", encoding="utf-8")
    wanted = version if version is not None else real_file.read_text(encoding="utf-8").strip()
    if not wanted:
        return
    for metadata in site.glob("ray-*.dist-info/METADATA"):
        text = metadata.read_text(encoding="utf-8")
        metadata.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {wanted}", text, count=1),
                            encoding="utf-8")
    text = version_py.read_text(encoding="utf-8")
    version_py.write_text(re.sub(r'(?m)^version = ".*"$', f'version = "{wanted}"', text,
                                 count=1), encoding="utf-8")


def apply(spec: dict[str, Any], site: Path) -> list[str]:
    """Bring ``site`` (a site-packages folder) in line with ``spec``; return what was written."""
    site.mkdir(parents=True, exist_ok=True)
    wanted = distributions(spec)
    written = []
    for folder in site.glob("*.dist-info"):
        name = folder.name.split("-")[0].lower()
        if name in STANDIN_DISTRIBUTIONS and (folder / "INSTALLER").exists() and \
                (folder / "INSTALLER").read_text(encoding="utf-8").strip() == "vllm-provision-lab":
            shutil.rmtree(folder)
    for name, version in wanted.items():
        written.append(write_dist_info(site, name, version).name)
    patch_ray_version(site, str(spec["ray"]) if spec.get("ray") else None)
    (site / PTH_NAME).write_text("import vllm_lab_standin.pyversion\n", encoding="utf-8")
    return written


def main() -> int:
    """Apply ``$VLLM_LAB_SPEC`` (default /etc/vllm-lab/spec.json) to this package's site dir."""
    from .common import load_spec

    site = Path(__file__).resolve().parent.parent
    for name in apply(load_spec(), site):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())


