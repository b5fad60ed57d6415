"""`provision fabric` measures the link between the lab's two hosts, and its verdict flips to slow
when `provision lab rate` shapes the link to a tenth of its rated speed.

The guests' veth reports no speed (``/sys/class/net/eth0/speed`` reads -1 inside the container),
as virtual NICs often do: the rate is given, 10 Gb/s (``--rated-gbps``), and the threshold is
--min-ratio 0.15, not the default 0.5: one Python TCP stream on the lab's two shared cores moves
a few Gb/s over the veth and bridge, not 5 (docs/evidence.md, "provision fabric"); shaped to
1 Gb/s it moves less than 1, a ratio under 0.1. Without --rated-gbps the verdict is
``unrated``.

Cost: about 11 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lab_support import provision
from vllm_provision_lab import Lab

pytestmark = pytest.mark.lab

MIN_RATIO = 0.15


def fabric(lab: Lab, state: Path, *extra: str) -> tuple[Any, dict[str, Any]]:
    run = provision("fabric", "-i", str(lab.inventory_path("mp")), "--seconds", "2",
                    "--min-ratio", str(MIN_RATIO), "--json", *extra, state_home=state,
                    timeout=180)
    return run, json.loads(run.stdout)


def probes_left(lab: Lab) -> list[str]:
    """The fabric probes still running on the lab's hosts (there must be none)."""
    found = []
    for host in ("h1", "h2"):
        proc = lab.ssh(host, "ps -eo args | grep '[e]xec(base64.b64decode' || true")
        found += [f"{host}: {line}" for line in proc.stdout.splitlines() if line.strip()]
    return found


def test_the_link_is_measured_and_flips_to_slow_when_shaped_to_a_tenth(
        lab: Lab, tmp_path: Path) -> None:
    run, result = fabric(lab, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    [pair] = result["pairs"]
    assert (pair["a"], pair["b"], pair["problem"]) == ("h1", "h2", None)
    assert pair["links"]["h2"]["interface"] == "eth0" and pair["links"]["h2"]["mtu"] > 0
    assert pair["links"]["h2"]["speed_mbps"] is None  # the guest's veth reports none
    assert 0 < pair["rtt_ms"]["min"] <= pair["rtt_ms"]["median"]
    assert pair["bytes"] > 0 and pair["verdict"] == "unrated", pair
    assert "no torch" in result["collective"]["reason"]  # the stand-in lab's venv has none
    assert probes_left(lab) == []

    run, result = fabric(lab, tmp_path, "--rated-gbps", "10", "--no-collective")
    assert run.returncode == 0, run.stdout + run.stderr
    [pair] = result["pairs"]
    assert pair["gbps"] > 1.5 and pair["rated_gbps"] == 10 and pair["verdict"] == "ok", pair

    lab.rate("h2", "1gbit")
    try:
        shaped_run, shaped = fabric(lab, tmp_path, "--rated-gbps", "10", "--no-collective")
    finally:
        lab.rate("h2", "off")
    assert shaped_run.returncode == 3, shaped_run.stdout + shaped_run.stderr
    [slow] = shaped["pairs"]
    # tbf counts frames, the probe counts payload: at most the shaped rate, well under 0.15
    assert slow["gbps"] <= 1.0 and slow["ratio"] < MIN_RATIO and slow["verdict"] == "slow"
    assert slow["causes"][0].startswith("a small MTU"), slow["causes"]
    assert probes_left(lab) == []
    # the last result is stored for `provision record`
    [stored] = (tmp_path / "vllm-provision").glob("lab-mp-*.evidence.json")
    assert json.loads(stored.read_text())["fabric"]["pairs"][0]["verdict"] == "slow"
