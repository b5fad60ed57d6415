"""JSON from hosts and servers is parsed without trusting it (``core.hostjson``): malformed,
over-size or deeply nested answers fail the one host that sent them with a clear problem,
never the run with an internal error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vllm_provision.backends.placement import parse_ray
from vllm_provision.core import hostjson
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host
from vllm_provision.facts.gather import ProbeOptions, probe_host
from vllm_provision.modules.ray_wait_cluster import parse_snapshot
from vllm_provision.state import parse_record

DEEP = "[" * 100_000 + "]" * 100_000
HOSTILE = [DEEP, '{"a": ' * 50_000 + "1" + "}" * 50_000, "{", "", "\x00", "[1, 2"]


@pytest.mark.parametrize("text", HOSTILE, ids=["deep-list", "deep-object", "open", "empty",
                                               "nul", "cut"])
def test_malformed_or_deep_json_is_a_decode_error(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        hostjson.loads(text)


def test_over_size_json_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(json.JSONDecodeError, match="more than 10"):
        hostjson.loads("[" + "1," * 10 + "1]", max_bytes=10)
    assert hostjson.loads('{"a": [1, 2]}') == {"a": [1, 2]}


class Answer:
    def __init__(self, stdout: str) -> None:
        self.stdout, self.stderr, self.exit_code, self.ok = stdout, "", 0, True


class Conn:
    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.name = "h1"

    def run(self, *args: Any, **kwargs: Any) -> Answer:
        return Answer(self.stdout)


@pytest.mark.parametrize("text", HOSTILE[:3])
def test_a_probe_answer_nested_too_deeply_fails_that_host_with_a_problem(text: str) -> None:
    with pytest.raises(ProvisionError) as raised:
        probe_host(Host("h1", "10.0.0.1"), Conn(text), None, ProbeOptions())
    assert "h1" in raised.value.render() and "did not return facts" in raised.value.render()


@pytest.mark.parametrize("text", HOSTILE[:3])
def test_a_state_record_nested_too_deeply_is_not_a_record(text: str) -> None:
    with pytest.raises(ProvisionError, match="h1:/var/lib"):
        parse_record(text, "h1:/var/lib/vllm-provision/state.json")


@pytest.mark.parametrize("line", [f"RAY-SNAPSHOT {DEEP}", "RAY-SNAPSHOT [1]",
                                  'RAY-SNAPSHOT {"nodes": 1}', "RAY-SNAPSHOT {"])
def test_a_broken_ray_snapshot_line_is_no_snapshot(line: str) -> None:
    assert parse_snapshot(line + "\n") is None


@pytest.mark.parametrize("line", [f"RAY-PLACEMENT {DEEP}", "RAY-PLACEMENT [1, 2]",
                                  "RAY-PLACEMENT nope"])
def test_a_broken_placement_line_is_no_placement(line: str) -> None:
    assert parse_ray(line) is None

