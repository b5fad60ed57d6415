"""``provision bench --front-door HOST`` (docs/front-door.md, "Measured through the front door"):
where the controller reaches a front door, what it adds against the direct run, and a host
that runs none refused before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from inventory_support import llama_yaml, write_inventory

from vllm_provision.cli import cli
from vllm_provision.core.errors import ProvisionError
from vllm_provision.evidence.bench import added_latency
from vllm_provision.inventory import load_inventory
from vllm_provision.inventory.gateways import client_url

GATEWAYS = """\
    vllm_gateways:
      vars: {vllm_gateway_wheelhouse: wheels}
      hosts:
        h1: {}
        gw: {ansible_host: 10.0.5.20, vllm_gateway_host: 10.0.5.21, vllm_gateway_port: 8080}
"""


def _inventory(tmp_path: Path) -> Path:
    return write_inventory(tmp_path, llama_yaml("mp") + GATEWAYS)


def test_a_front_door_is_reached_on_its_bind_address_or_its_host_s(tmp_path: Path) -> None:
    inventory = load_inventory(_inventory(tmp_path))
    assert client_url(inventory, "h1") == "http://10.0.0.11:30000"  # binds every interface
    assert client_url(inventory, "gw") == "http://10.0.5.21:8080"
    with pytest.raises(ProvisionError) as raised:
        client_url(inventory, "h2")
    text = str(raised.value)
    assert "'h2' runs no front door" in text and "h1, gw" in text


def test_the_added_latency_is_the_front_door_run_s_quantiles_minus_the_direct_run_s() -> None:
    direct = {"ttft_s": {"p50": 0.050, "p99": 0.060}, "e2e_s": {"p50": 0.200, "p99": 0.250}}
    through = {"ttft_s": {"p50": 0.0513, "p99": 0.0598}, "e2e_s": {"p50": 0.2011, "p99": None}}
    assert added_latency(direct, through) == {
        "ttft_p50_s": 0.0013, "ttft_p99_s": -0.0002, "e2e_p50_s": 0.0011, "e2e_p99_s": None}
    assert added_latency({}, through)["ttft_p50_s"] is None


def test_bench_refuses_a_host_without_a_front_door_before_sending_anything(
        tmp_path: Path) -> None:
    """The refusal comes from the inventory, before any connection (there is no host to
    reach here), as the command line shows it: the error block, exit 1, no traceback."""
    path = _inventory(tmp_path)
    result = CliRunner().invoke(cli, ["bench", "-i", str(path), "--front-door", "h9"])
    assert isinstance(result.exception, ProvisionError) and result.exit_code == 1
    text = str(result.exception)
    assert "'h9' runs no front door" in text and "vllm_gateways" in text
