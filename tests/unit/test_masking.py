"""The masker hides a secret in every encoding the tool writes it in, not only the raw one."""

from __future__ import annotations

import json
import shlex
import urllib.parse

import jinja2
import pytest

from vllm_provision.core import quoting
from vllm_provision.settings.masking import Masker
from vllm_provision.settings.variables import MASK

# Characters that JSON, Jinja's tojson, the shell, systemd and URLs each escape differently.
KEY = 'k"e\\y<$%{x}\'&>é-9'

ENCODERS = {
    "raw": lambda s: s,
    "json": lambda s: json.dumps({"api_key": s}),
    "json-unicode": lambda s: json.dumps({"api_key": s}, ensure_ascii=False),
    "jinja-tojson": lambda s: jinja2.Environment().from_string(
        "{{ c | tojson(indent=2) }}").render(c={"probe": {"api_key": s}}),
    "repr": lambda s: repr(s),
    "repr-in-list": lambda s: repr(["x'y", s]),
    "repr-of-json": lambda s: repr(json.dumps(s)),
    "shell": lambda s: "curl -H " + shlex.quote(f"Authorization: Bearer {s}"),
    "shell-word": lambda s: shlex.join(["echo", s]),
    "systemd-exec": lambda s: "ExecStart=" + quoting.systemd_exec_quote(["/bin/vllm", s]),
    "env-file": lambda s: quoting.env_file_line("VLLM_API_KEY", s),
    "url": lambda s: "http://h/?key=" + urllib.parse.quote(s, safe=""),
    "url-plus": lambda s: "key=" + urllib.parse.quote_plus(s),
}


@pytest.mark.parametrize("encoding", sorted(ENCODERS))
def test_every_encoding_of_the_secret_is_masked(encoding: str) -> None:
    text = ENCODERS[encoding](KEY)
    masked = Masker([KEY]).text(f"before {text} after")
    assert MASK in masked
    for form in ("k\"e", "e\\y", "k\\\"e", "y<$", "y\\u003c", "%{x}", "k%22e"):
        assert form not in masked, (encoding, masked)
    assert masked.startswith("before ") and masked.endswith(" after")


def test_a_diff_line_of_the_watchdog_config_is_masked() -> None:
    rendered = ENCODERS["jinja-tojson"](KEY)
    diff = "\n".join(f"+{line}" for line in rendered.splitlines())
    assert KEY not in Masker([KEY]).text(diff)
    assert '"api_key": "********"' in Masker([KEY]).text(diff)


def test_ordinary_text_is_left_alone() -> None:
    text = 'a "quoted" word, 100% $HOME and \\n'
    assert Masker([KEY]).text(text) == text


def test_json_data_is_masked_in_every_string() -> None:
    data = {"message": json.dumps(KEY), "items": [shlex.quote(KEY)], "api_key": "x"}
    masked = Masker([KEY]).data(data)
    assert KEY not in json.dumps(masked) and json.dumps(KEY)[1:-1] not in json.dumps(masked)
    assert masked["api_key"] == MASK
