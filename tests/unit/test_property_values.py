"""Property tests (hypothesis): random text in every string variable and name is either refused
at load with a located error, or rendered so that no unit gains a line or directive, no env file
gains a variable, and every command and ExecStart= keeps the value one word."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from render_support import env_values, exec_words, rendered_files, shape, unit_words

from vllm_provision.core import quoting
from vllm_provision.core.errors import InventoryError
from vllm_provision.inventory import load_inventory
from vllm_provision.settings import kinds, variables

HOSTILE = Path(__file__).resolve().parents[1] / "data" / "inventories" / "hostile"
BASE = yaml.safe_load((HOSTILE / "base.yml").read_text())

# Characters a shell, systemd or an env-file parser treats specially, plus control characters,
# line separators and some non-ASCII: hypothesis mixes them with ordinary text.
SPECIAL = list(" \t\n\r\x00\x0b\x1b\u2028\u2029\u00a0'\"`$\\;|&<>(){}[]*?~#!%=,:@/.-+^")
TEXT = st.text(alphabet=st.one_of(st.sampled_from(SPECIAL), st.characters(codec="utf-8")),
               max_size=24)
LINE = TEXT.filter(lambda t: quoting.find_control_chars(t) is None)

STRING_VARIABLES = sorted(
    [v.name for v in variables.VARIABLES.values() if v.type is str and not v.choices]
    + [name for name, default in variables.role_defaults().items()
       if isinstance(default, str) and kinds.kind_of(name) != "choice"])
TARGETS = [*STRING_VARIABLES, "@host_name", "@group_name", "@env_value", "@env_name",
           "@extra_arg"]
PROFILE = settings(max_examples=400, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
_BASELINE: dict[str, Any] = {}


def _baseline(tmp_path: Path) -> dict[str, Any]:
    if not _BASELINE:
        path = tmp_path / "base.yml"
        path.write_text(yaml.safe_dump(BASE))
        _BASELINE.update(shape(load_inventory(path)))
    return _BASELINE


def _inventory(target: str, text: str) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    replica = data["all"]["children"]["vllm_replicas"]["children"]["llama"]
    if target == "@host_name":
        replica["hosts"] = {text: replica["hosts"]["h1"], "h2": replica["hosts"]["h2"]}
    elif target == "@group_name":
        data["all"]["children"]["vllm_replicas"]["children"] = {text: replica}
    elif target == "@env_value":
        replica["vars"]["vllm_env"] = {"NCCL_DEBUG": text}
    elif target == "@env_name":
        replica["vars"]["vllm_env"] = {text: "1"}
    elif target == "@extra_arg":
        replica["vars"]["vllm_extra_args"] = ["--dtype", text]
    elif variables.VARIABLES.get(target) is not None and variables.VARIABLES[target].scope \
            == "host":
        replica["hosts"]["h1"][target] = text
    else:
        replica["vars"][target] = text
    return data


# the variables whose value becomes an env-file line of its own when set (roles/*/templates)
ADDS_ENV = {"vllm_api_key": {"VLLM_API_KEY"}, "vllm_hf_token": {"HF_TOKEN"}}


@settings(PROFILE)
@given(target=st.sampled_from(TARGETS), text=TEXT)
def test_random_text_is_refused_or_inert(target: str, text: str, tmp_path_factory:
                                         pytest.TempPathFactory) -> None:
    tmp_path = tmp_path_factory.mktemp("prop")
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(_inventory(target, text)))
    try:
        inventory = load_inventory(path)
    except InventoryError as error:
        for problem in error.problems:  # located, with a fix, one problem line per issue
            assert problem.where.startswith(str(path)) and problem.fix
        return
    baseline = _baseline(tmp_path)
    files = dict(rendered_files(inventory))
    got = shape(files)
    for label, (kind, lines, *keys) in got.items():
        base = baseline[label.replace(f"{text}:", "h1:", 1)] if target == "@host_name" \
            else baseline[label]
        if kind == "unit":
            assert (lines, keys[0]) == (base[1], base[2]), label
        elif kind == "env":
            # a new variable only where the case adds one on purpose
            allowed = {text} if target == "@env_name" else {"NCCL_DEBUG"} if (
                target == "@env_value") else ADDS_ENV.get(target, set())
            assert set(keys[0]) - set(base[2]) <= allowed, label
            assert lines - base[1] <= len(allowed), label
    if target in ("@extra_arg", "vllm_model", "vllm_served_model_name"):
        words = [w for label, body in files.items() if label.endswith(".service.j2")
                 for argv in exec_words(body) for w in argv]
        assert text in words
    if target == "@env_value":
        assert text in [v for label, body in files.items() if label.endswith(".env.j2")
                        for v in env_values(body).values()]


@settings(PROFILE)
@given(text=TEXT)
def test_quoting_functions_keep_a_value_one_word_or_refuse_it(text: str) -> None:
    if quoting.find_control_chars(text) is not None:
        for call in (lambda: quoting.shell_quote(text),
                     lambda: quoting.systemd_exec_quote(["/bin/x", text]),
                     lambda: quoting.env_file_line("K", text)):
            with pytest.raises(ValueError):
                call()
        return
    assert shlex.split(quoting.shell_quote(text)) == [text]
    assert shlex.split("id -- " + quoting.shell_join([text, text])) == ["id", "--", text, text]
    assert unit_words(quoting.systemd_exec_quote(["/bin/x", text, "y"])) == ["/bin/x", text, "y"]
    assert env_values(quoting.env_file_line("K", text)) == {"K": text}
