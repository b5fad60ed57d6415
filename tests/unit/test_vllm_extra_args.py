"""vllm_extra_args read as vLLM's parser reads it, at load (inventory/extra_args.py): options we
own refused in every spelling the release accepts, ambiguous and refused abbreviations in
vLLM's words, unknown options and bad values when the release is pinned; a property test over
every prefix of every owned option of every release of the small table (and the real one when
present)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inventory_support import load_llama
from vllm_table_support import TEXT, clear, no_table, use_table

from vllm_provision.core.errors import ProvisionError
from vllm_provision.inventory.extra_args import check_extra_args, owner_of
from vllm_provision.inventory.source import Problems
from vllm_provision.settings import vllm_cli


def refusals(args: list[str], pin: str | None = None, backend: str = "mp") -> list:
    problems = Problems()
    check_extra_args(args, None, backend, problems, "inventory.yml: llama", pin=pin)
    return problems.items


def one(args: list[str], pin: str | None = None, backend: str = "mp"):
    [problem] = refusals(args, pin, backend)
    return problem


@pytest.mark.parametrize(("word", "full", "kind"), [
    ("--nnode", "--nnodes", "render"), ("--nnodes=2", "--nnodes", "render"),
    ("--tensor-parallel", "--tensor-parallel-size", "vllm_tensor_parallel_size"),
    ("--tensor_parallel_size", "--tensor-parallel-size", "vllm_tensor_parallel_size"),
    ("--api-ke", "--api-key", "vllm_api_key"), ("--head", "--headless", "render"),
    ("--distributed-exec=ray", "--distributed-executor-backend", "render"),
])
def test_an_abbreviation_of_an_owned_option_is_refused_naming_what_it_abbreviates(
        small_table, word, full, kind):
    problem = one([word, "4"] if "=" not in word and word != "--head" else [word])
    assert f"must not contain {word.split('=')[0]}" in problem.message
    assert full in problem.message and kind in problem.message + problem.fix


def test_the_abbreviation_message_names_the_release_read_and_the_full_option(small_table):
    problem = one(["--nnode", "2"], pin="0.12.0")
    assert problem.message.startswith(
        "vllm_extra_args must not contain --nnode (--nnode abbreviates --nnodes for vLLM "
        "0.12.0's parser): we render it ourselves (it is the number of hosts of the replica)")
    assert problem.fix == "remove '--nnode' from vllm_extra_args"


def test_a_secret_abbreviation_never_shows_its_value(small_table):
    problem = one(["--api-ke", "sk-secret"])
    assert "sk-secret" not in repr(problem) and problem.actual == "--api-ke ********"
    assert "vllm_api_key" in problem.fix


def test_an_ambiguous_abbreviation_is_refused_in_vllm_s_words_with_a_fix(small_table):
    problem = one(["--data-parallel", "2"])
    assert problem.message == (
        "vllm_extra_args: ambiguous option: --data-parallel could match "
        "--data-parallel-address, --data-parallel-hybrid-lb, --data-parallel-rpc-port, "
        "--data-parallel-size (vLLM 0.26.0)")
    assert problem.fix.startswith("write the option in full: --data-parallel-address or ")


def test_without_abbreviations_an_owned_prefix_is_unrecognized_naming_the_release(small_table):
    message = one(["--nnode", "2"], pin="0.15.0").message
    for said in ("vLLM 0.15.0 takes no abbreviations", '"unrecognized arguments: --nnode"'):
        assert said in message


def test_without_abbreviations_any_prefix_is_unrecognized_when_pinned(small_table):
    problem = one(["--max-num-s", "8"], pin="0.15.0")
    assert problem.message == ("vllm_extra_args: unrecognized arguments: --max-num-s (vLLM 0.15.0 "
                               "takes no abbreviations; it would abbreviate --max-num-seqs)")
    assert refusals(["--max-num-s", "8"], pin="0.26.0") == []


def test_an_unknown_option_is_an_error_only_when_the_release_is_pinned(small_table):
    assert refusals(["--no-such-option", "1"]) == []
    problem = one(["--no-such-option", "1"], pin="0.26.0")
    assert problem.message == ("vllm_extra_args: unrecognized arguments: --no-such-option (vLLM "
                               "0.26.0 has no such option)")
    assert "no release this tool knows has it" in problem.fix


def test_an_option_of_a_later_release_names_the_first_release_that_has_it(small_table):
    problem = one(["--all2all-backend", "naive"], pin="0.11.1")
    assert "vLLM 0.11.1 has no such option" in problem.message
    assert "pin (and install) vLLM 0.12.0 or later" in problem.fix


def test_a_value_outside_the_choices_is_refused_when_pinned(small_table):
    problem = one(["--kv-cache-dtype", "fp4"], pin="0.26.0")
    assert (problem.message, problem.fix) == (
        "vllm_extra_args: argument --kv-cache-dtype: invalid choice: 'fp4' (choose from 'auto', "
        "'fp8') (vLLM 0.26.0)", "give --kv-cache-dtype one of 'auto', 'fp8'")
    assert "invalid int value: 'many'" in one(["--max-num-seqs=many"], pin="0.26.0").message
    assert refusals(["--kv-cache-dtype", "fp8", "--max-num-seqs=8", "--enforce-eager"],
                    pin="0.26.0") == []


def test_a_negative_number_is_a_value_and_a_value_is_not_an_option(small_table):
    first, second = refusals(["--max-num-seqs", "-1", "--tokenizer", "--x"], pin="0.26.0")
    assert first.message == ("vllm_extra_args: argument --tokenizer: expected one argument "
                             "(vLLM 0.26.0)")
    assert second.message.endswith("--x (vLLM 0.26.0 has no such option)")
    assert refusals(["--tokenizer", "/srv/tok", "--enforce-eager"], pin="0.26.0") == []


def test_without_the_table_the_exact_names_are_still_refused(monkeypatch):
    no_table(monkeypatch)
    assert "we render it ourselves" in one(["--nnodes", "2"]).message
    assert "vllm_tensor_parallel_size" in one(["--tensor_parallel_size=4"]).message
    assert "secret" in one(["--api-k", "x"]).message
    assert refusals(["--nnode", "2"]) == []  # the abbreviation needs the table
    clear()


def test_load_refuses_an_abbreviation_with_the_file_and_the_item(small_table, tmp_path):
    with pytest.raises(ProvisionError) as raised:
        load_llama(tmp_path, "mp", vllm_extra_args="['--nnode', '2']")
    text = str(raised.value)
    assert "vllm_extra_args" in text and "--nnode abbreviates --nnodes" in text


def test_load_refuses_a_pin_that_is_not_a_version_naming_file_and_fix(small_table, tmp_path):
    with pytest.raises(ProvisionError) as raised:
        load_llama(tmp_path, "mp", vllm_version="latest")
    text = str(raised.value)
    assert "inventory.yml" in text and "vllm_version of replica 'llama' is not a vLLM version" \
        in text and "'latest'" in text and "pip show vllm" in text


def test_a_pin_newer_than_the_table_reads_as_its_newest_with_a_warning(small_table, tmp_path,
                                                                        caplog):
    inventory = load_llama(tmp_path, "mp", vllm_version="0.40.0",
                           vllm_extra_args="['--max-num-seqs', '8']")
    assert inventory.replicas[0].engine.extra_args == ("--max-num-seqs", "8")
    assert "newer than the newest release in the vllm serve table (0.26.0)" in caplog.text


# -- the property: every prefix argparse resolves to an owned option is refused -----------------

def _tables() -> list[tuple[str, str]]:
    return [("small", TEXT), ("shipped", vllm_cli._shipped_text())]


def _cases(text: str) -> list[tuple[str, str, str, bool]]:
    """(release, word, the option it resolves to, owned) for every prefix of every long option
    of every release that the release's parser resolves: an exact spelling, or, where the
    release allows abbreviations, a prefix that starts the spellings of one option only
    (argparse's rule, Lib/argparse.py _parse_optional, computed here without the code under
    test)."""
    cases = []
    seen: set[tuple] = set()
    for index, release in enumerate(vllm_cli.releases(text)):
        surface = vllm_cli._surface_at(index, text)
        same = (surface.allow_abbrev, tuple(sorted(surface.flags)))
        if same in seen:  # a release with the same options resolves every word the same way
            continue
        seen.add(same)
        starts: dict[str, set[str]] = {}
        for spelling, flag in surface.flags.items():
            if spelling.startswith("--"):
                for end in range(3, len(spelling) + 1):
                    starts.setdefault(spelling[:end], set()).add(flag.name)
        for word, names in starts.items():
            exact = surface.flags.get(word)
            if exact is not None:
                name = exact.name
            elif surface.allow_abbrev and len(names) == 1:
                name = next(iter(names))
            else:
                continue
            owned = any(owner_of(s) for s in surface.flags[name].spellings())
            cases.append((release, word, name, owned))
    return sorted(cases)


@pytest.mark.parametrize(("label", "text"), _tables(), ids=[t[0] for t in _tables()])
def test_every_resolving_prefix_of_an_owned_option_is_refused_and_no_other(monkeypatch, label,
                                                                           text):
    use_table(monkeypatch, text)
    cases = _cases(text)
    owned = [c for c in cases if c[3]]
    assert owned and len(owned) < len(cases)

    @settings(max_examples=min(400, len(cases)), deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.sampled_from(cases), st.booleans(), st.booleans())
    def prop(case, spaced, underscored):
        release, word, name, is_owned = case
        if underscored:  # FlexibleArgumentParser reads --a_b as --a-b
            word = "--" + word[2:].replace("-", "_")
        args = [word, "1"] if spaced else [word + "=1"]
        items = refusals(args, pin=release)
        owned_refusals = [p for p in items if "must not contain" in p.message]
        if is_owned:
            assert owned_refusals, (release, word, name)
        else:
            assert not owned_refusals, (release, word, name, items)

    prop()
    # and exhaustively, for the owned ones: 100 % of the cases, not a sample
    missed = [c for c in owned
              if not any("must not contain" in p.message for p in refusals([c[1], "1"], c[0]))]
    assert missed == []
    clear()


def test_a_pin_older_than_the_table_is_read_with_the_newest_release_and_a_warning(small_table,
                                                                                 caplog):
    assert refusals(["--no-such-option", "1"], pin="0.9.2") == []  # not pinned to a release
    assert "older than the oldest release this tool knows (0.10.0)" in caplog.text
    assert "--nnode abbreviates --nnodes for vLLM 0.26.0" in one(["--nnode", "2"], "0.9.2").message
