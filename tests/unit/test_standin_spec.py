"""The lab spec and prepare_host: defaults, per-host overrides, what lands in a host root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_provision_lab.errors import LabError
from vllm_provision_lab.gpu import prepare_host
from vllm_provision_lab.gpu.spec import effective_spec, parse_assignments, write_overrides


def test_defaults_are_the_reference_scenario(tmp_path: Path) -> None:
    spec = effective_spec(tmp_path, "h1")
    assert (spec["gpus"], spec["gpu_name"], spec["gpu_memory_mib"]) == (4, "NVIDIA H200", 143771)
    assert (spec["driver"], spec["cuda"], spec["nccl"]) == ("580.95.05", "13.0", "2.28.9")
    assert (spec["torch"], spec["torch_cuda"], spec["vllm"]) == ("2.14.0", "cu130", "0.33.0")
    assert spec["python"] is None and spec["host"] == "h1"


def test_per_host_values_override_only_that_host(tmp_path: Path) -> None:
    (tmp_path / "spec.yml").write_text("load_s: 1\nhosts:\n  h2: {nccl: 2.27.3, gpus: 2}\n")
    h1, h2 = effective_spec(tmp_path, "h1"), effective_spec(tmp_path, "h2")
    assert (h1["nccl"], h1["gpus"], h1["load_s"]) == ("2.28.9", 4, 1.0)
    assert (h2["nccl"], h2["gpus"], h2["load_s"]) == ("2.27.3", 2, 1.0)


def test_lab_set_overrides_win_over_the_spec_file(tmp_path: Path) -> None:
    (tmp_path / "spec.yml").write_text("hosts:\n  h2: {vllm: 0.32.0}\n")
    write_overrides(tmp_path, {"h2": {"vllm": "0.33.1"}})
    assert effective_spec(tmp_path, "h2")["vllm"] == "0.33.1"
    assert effective_spec(tmp_path, "h1")["vllm"] == "0.33.0"


@pytest.mark.parametrize("text", ["gpus: four\n", "bogus_key: 1\n", "load_s: -1\n"])
def test_invalid_spec_values_are_rejected_with_the_key(tmp_path: Path, text: str) -> None:
    (tmp_path / "spec.yml").write_text(text)
    with pytest.raises(LabError) as caught:
        effective_spec(tmp_path, "h1")
    assert text.split(":")[0] in str(caught.value)



@pytest.mark.parametrize(("name", "text", "says", "fix"), [
    ("spec.yml", "hosts: [\n", "cannot read the lab spec", "fix the YAML or run lab up"),
    ("gpu-overrides.json", "{not json", "cannot read lab overrides", "delete {path} to go back"),
], ids=["spec", "overrides"])
def test_an_unreadable_state_file_is_a_lab_error_naming_it(tmp_path: Path, name: str, text: str,
                                                           says: str, fix: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(LabError) as caught:
        effective_spec(tmp_path, "h1")
    rendered = caught.value.render()
    assert str(tmp_path / name) in rendered and says in rendered
    assert fix.format(path=tmp_path / name) in rendered

def test_assignments_split_values_and_resets() -> None:
    assert parse_assignments(["vllm=0.33.1", "nccl=default"]) == ({"vllm": "0.33.1"}, ["nccl"])
    with pytest.raises(LabError):
        parse_assignments(["vllm"])


def _guest_python(root: Path, code: str) -> str:
    site = root / "opt/vllm/lib/python3.11/site-packages"
    env = dict(os.environ, VLLM_LAB_SPEC=str(root / "etc/vllm-lab/spec.json"))
    env.pop("PYTHONPATH", None)
    result = subprocess.run([sys.executable, "-S", "-c",
                             f"import site; site.addsitedir({str(site)!r}); {code}"],
                            env=env, capture_output=True, text=True, check=True)
    return result.stdout.strip()


def test_prepare_host_makes_the_venv_report_the_spec_versions(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "spec.yml").write_text("hosts:\n  h2: {vllm: 0.33.1, nccl: 2.27.3, "
                                    "python: 3.11.1}\n")
    root = tmp_path / "root"
    prepare_host(root, "h2", state)
    out = _guest_python(root, "import importlib.metadata as m, platform, sys; print(m.version("
                        "'vllm'), m.version('torch'), m.version('nvidia-nccl-cu13'), "
                        "platform.python_version(), sys.version_info.micro)")
    assert out == "0.33.1 2.14.0+cu130 2.27.3 3.11.1 1"
    assert json.loads((root / "etc/vllm-lab/spec.json").read_text())["host"] == "h2"
    assert os.access(root / "usr/bin/nvidia-smi", os.X_OK)
    assert os.access(root / "opt/vllm/bin/vllm", os.X_OK)
    assert (root / "srv/models/lab-model/config.json").exists()


def test_cuda_12_gets_the_cu12_nccl_distribution(tmp_path: Path) -> None:
    (tmp_path / "spec.yml").write_text("cuda: '12.9'\n")
    root = tmp_path / "root"
    prepare_host(root, "h1", tmp_path)
    out = _guest_python(root, "import importlib.metadata as m; print(m.version('torch'), "
                        "m.version('nvidia-nccl-cu12'))")
    assert out == "2.14.0+cu129 2.28.9"


def test_ray_override_is_undone_by_the_default(tmp_path: Path) -> None:
    """``lab set h2 ray=2.59.0`` patches the base's real Ray; ``ray=default`` puts it back
    (bullseye's base has 2.51.2, so the default cannot be one fixed number)."""
    from vllm_provision_lab.gpu.guest.vllm_lab_standin.apply import patch_ray_version

    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "_version.py").write_text('version = "2.51.2"\ncommit = "x"\n')
    meta = tmp_path / "ray-2.51.2.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: ray\nVersion: 2.51.2\n")
    patch_ray_version(tmp_path, None)
    assert 'version = "2.51.2"' in (tmp_path / "ray" / "_version.py").read_text()
    patch_ray_version(tmp_path, "2.59.0")
    assert "Version: 2.59.0" in (meta / "METADATA").read_text()
    assert 'version = "2.59.0"' in (tmp_path / "ray" / "_version.py").read_text()
    patch_ray_version(tmp_path, None)
    assert "Version: 2.51.2" in (meta / "METADATA").read_text()
    assert 'version = "2.51.2"' in (tmp_path / "ray" / "_version.py").read_text()


def test_stall_takes_only_the_phases_the_stand_in_knows(tmp_path: Path) -> None:
    assert effective_spec(tmp_path, "h2")["stall"] == "none"  # default: no stall
    write_overrides(tmp_path, {"h2": {"stall": "load"}})
    assert effective_spec(tmp_path, "h2")["stall"] == "load"
    assert effective_spec(tmp_path, "h1")["stall"] == "none"
    write_overrides(tmp_path, {"h2": {"stall": "loading"}})
    with pytest.raises(LabError) as error:
        effective_spec(tmp_path, "h2")
    text = str(error.value)
    assert "h2.stall" in text and "one of none, init, load, kv_cache, graphs" in text
    assert "stall=default" in text


class _Stuck(Exception):
    """The stand-in reached its endless sleep."""


@pytest.mark.parametrize("first_rank", [True, False])
@pytest.mark.parametrize("stall, last_phase", [
    ("init", None), ("load", "loading weights"), ("kv_cache", "sizing the KV cache"),
    ("graphs", "sizing the KV cache"), ("none", "capturing CUDA graphs"),
])
def test_the_stand_in_stalls_where_the_product_reads_the_phase(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stall: str,
        last_phase: str | None, first_rank: bool) -> None:
    """The lines up to the stall are vLLM's (the product's parser reads them); a stall in the
    graph capture shows the KV-cache phase, as a real capture whose tqdm bar has not ended."""
    from vllm_provision_lab.gpu.guest.vllm_lab_standin import common

    from vllm_provision.output.phases import label_of, phase_of

    def sleep(seconds: float) -> None:
        if seconds >= 3600:
            raise _Stuck

    monkeypatch.setattr(common.time, "sleep", sleep)
    spec = {"load_s": 1.0, "stall": stall}
    if stall == "none":
        common.startup_phases(spec, "/nonexistent", 4096, first_rank=first_rank)
    else:
        with pytest.raises(_Stuck):
            common.startup_phases(spec, "/nonexistent", 4096, first_rank=first_rank)
    phases = [p for p in map(phase_of, capsys.readouterr().err.splitlines()) if p]
    assert (label_of(phases[-1]) if phases else None) == last_phase
