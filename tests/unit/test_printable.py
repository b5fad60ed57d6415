"""Text from hosts, servers and files is printable before it reaches a terminal, a log, the
decision record: no control or bidi character comes out raw, no value becomes rich markup or
Markdown structure (core/text.py and the printing paths that use it)."""

from __future__ import annotations

import io
import json
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.core.text import BIDI_CONTROLS, markdown_inline, printable

OSC_TITLE = "\x1b]0;evil\x07"
CLEAR = "\x1b[2J"
ATTACKS = [OSC_TITLE, CLEAR, "ok\rFAILED", "\u202egpj.exe", "\x9b2J", "\x9d0;t\x9c",
           "a\x08\x08b", "\x1b[1A\x1b[2K", "\u2066x\u2069", "\x7f", "\x00", "\x1bc",
           "line\u2028next"]

# every C0 and C1 control, DEL, ESC sequences, the bidi controls, mixed into ordinary text
CONTROLS = [chr(c) for c in range(0x20)] + ["\x7f"] + [chr(c) for c in range(0x80, 0xa0)]
HOSTILE = st.lists(st.one_of(
    st.sampled_from(CONTROLS + sorted(BIDI_CONTROLS) + ATTACKS + ["\u2028", "\u2029", "\ufeff",
                                                                "\r\n", "[bold]", "[/]"]),
    st.text(max_size=8)), max_size=12).map("".join)


def bad_chars(text: str, allowed: str = "") -> list[str]:
    """Characters a terminal would interpret: controls, bidi and other format characters,
    separators (spaces but U+0020-like Zs allowed), surrogates, unassigned."""
    return [c for c in text if c not in allowed and (
        c in BIDI_CONTROLS or (not c.isprintable() and unicodedata.category(c) != "Zs"))]


@given(HOSTILE)
@settings(max_examples=200, deadline=None)
def test_printable_leaves_no_control_or_bidi_character(text: str) -> None:
    assert bad_chars(printable(text), allowed="\t") == []
    assert bad_chars(printable(text, tabs=False)) == []
    assert bad_chars(printable(text, newlines=True), allowed="\n\t") == []
    assert "\r" not in printable(text, newlines=True)


@given(st.text(alphabet=st.characters(categories=["L", "N", "P", "S", "Zs"])))
def test_printable_text_is_left_as_it_is(text: str) -> None:
    assert printable(text) == text  # no false alarm: ordinary text, unicode included


@pytest.mark.parametrize(("sent", "shown"), [
    (OSC_TITLE, "\\x1b]0;evil\\x07"), (CLEAR, "\\x1b[2J"), ("ok\rFAILED", "ok\\x0dFAILED"),
    ("\u202egpj.exe", "\\u202egpj.exe"), ("\x9b2J", "\\x9b2J"), ("a\nb", "a\\x0ab"),
    ("\U000e0041", "\\U000e0041"), ("tab\there", "tab\there")])
def test_known_attacks_are_shown_not_run(sent: str, shown: str) -> None:
    assert printable(sent) == shown


def test_newlines_are_kept_where_the_caller_asks_and_crlf_is_one_newline() -> None:
    assert printable("a\r\nb\nc\rd", newlines=True) == "a\nb\nc\\x0dd"
    assert printable("x" * 10, limit=4) == "xxx…"
    assert printable(None) == ""


def _report(result: TaskResult) -> str:
    from vllm_provision.output.report import HumanReporter

    stream = io.StringIO()
    reporter = HumanReporter(stream, diff_mode=True)
    reporter.task_started(result.task)
    reporter.task_result(result)
    reporter.recap({"hosts": {result.host: {"ok": 0, "changed": 0, "failed": 1, "skipped": 0,
                                             "unreachable": 0}},
                    "check_mode": False, "duration_s": 1.0, "changed": 0, "ok": 0,
                    "failed": 1, "unreachable": 0, "skipped": 0})
    return stream.getvalue()


@given(HOSTILE, HOSTILE)
@settings(max_examples=100, deadline=None)
def test_the_human_report_prints_no_control_character_from_a_host(message: str,
                                                                    diff: str) -> None:
    out = _report(TaskResult("h1", "start vllm", Status.FAILED, message=message, diff=diff))
    assert bad_chars(out, allowed="\n\t") == []


def test_the_human_report_shows_host_text_and_markup_literally() -> None:
    out = _report(TaskResult("h1", "t", Status.FAILED,
                             message=f"exit 1: {OSC_TITLE}[bold red]x[/bold red]{CLEAR}"))
    assert "\\x1b]0;evil\\x07[bold red]x[/bold red]\\x1b[2J" in out
    assert "\x1b" not in out


@given(HOSTILE)
@settings(max_examples=100, deadline=None)
def test_an_error_from_a_host_is_printed_printable(actual: str) -> None:
    from vllm_provision.output.report import render_error

    stream = io.StringIO()
    render_error(ProvisionError([Problem("h1", f"journalctl failed: {actual}",
                                         actual=actual, fix="[b]fix[/b]")]), stream)
    out = stream.getvalue()
    assert bad_chars(out, allowed="\n\t") == []
    assert "[b]fix[/b]" in out  # markup from text is shown, not applied


@given(HOSTILE)
@settings(max_examples=200, deadline=None)
def test_a_journal_line_is_printable_in_provision_logs(message: str) -> None:
    from vllm_provision.output import logs

    line = json.dumps({"__REALTIME_TIMESTAMP": "1700000000000000", "MESSAGE": message,
                       "_SYSTEMD_UNIT": "vllm.service"})
    binary = json.dumps({"__REALTIME_TIMESTAMP": "1", "MESSAGE": list(message.encode(
        "utf-8", "surrogatepass"))})
    for text in (line, binary):
        entry = logs.parse_entry(text, "h1", 0, ["vllm.service"])
        assert entry is not None
        assert bad_chars(" ".join(logs.line_parts(entry, 4, 12)), allowed="\t") == []


def test_the_cli_echo_and_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_provision.cli.options import echo
    from vllm_provision.output.report import print_json

    echo(f"h1: {OSC_TITLE}{CLEAR}ok\rFAILED\u202e\nnext")
    assert capsys.readouterr().out == "h1: \\x1b]0;evil\\x07\\x1b[2Jok\\x0dFAILED\\u202e\nnext\n"
    value = {"message": f"{OSC_TITLE}\u202e\\x1b"}
    print_json(value)
    out = capsys.readouterr().out
    assert "\\u001b" in out and "\\u202e" in out and "\x1b" not in out
    assert json.loads(out) == value  # exact: JSON escapes, nothing escaped twice
    echo(json.dumps(value))
    assert json.loads(capsys.readouterr().out) == value  # echo leaves a JSON line as it is


def test_a_run_lock_holder_file_cannot_reach_the_terminal() -> None:
    from vllm_provision.transport.runlock import Holder

    holder = Holder.parse(json.dumps({"controller": f"ctl{CLEAR}", "user": OSC_TITLE,
                                      "pid": 1, "started": "\u202enow", "command": "up\r"}))
    assert holder is not None
    said = holder.describe()
    assert bad_chars(said) == [] and "\\x1b]0;evil\\x07" in said


# --- Markdown (the decision record) --------------------------------------------------------

MD = MarkdownIt("commonmark").enable("table").enable("strikethrough")
STRUCTURE = {"html_inline", "html_block", "heading_open", "link_open", "image", "em_open",
             "strong_open", "code_inline", "s_open", "bullet_list_open", "ordered_list_open",
             "blockquote_open", "hr", "fence", "code_block", "softbreak"}


def _types(tokens: list) -> list[str]:
    """Every token's type, children included."""
    found = []
    for token in tokens:
        found.append(token.type)
        found += _types(token.children or [])
    return found


@given(HOSTILE | st.text(alphabet="|\\`*_[]()#<>&!~-+=.:/ \n1aé{}", max_size=30))
@settings(max_examples=400, deadline=None)
def test_a_markdown_value_stays_in_its_cell_and_line(value: str) -> None:
    cell = markdown_inline(value)
    assert bad_chars(cell) == [] and "\n" not in cell
    table = f"| | a |\n|---|---|\n| k | {cell} |\n| z | y |\n"
    types = _types(MD.parse(table))
    assert types.count("tr_open") == 3 and types.count("td_open") == 4  # no new row or cell
    assert not STRUCTURE & set(types), types
    for line in (f"# title {cell}", f"- item {cell}", cell):
        types = _types(MD.parse(line + "\n"))
        assert not (STRUCTURE - {"heading_open", "bullet_list_open"}) & set(types), types
        assert types.count("heading_open") == line.startswith("#")
        assert types.count("bullet_list_open") == line.startswith("- ")


def test_markdown_known_attacks() -> None:
    assert markdown_inline("a|b") == "a\\|b"
    assert markdown_inline("<script>x</script>") == "&lt;script&gt;x&lt;/script&gt;"
    assert markdown_inline("x\n## forged") == "x\\\\x0a\\#\\# forged"  # shown: x\x0a## forged
    assert markdown_inline("# h") == "\\# h" and markdown_inline("- li") == "\\- li"
    assert markdown_inline("&#124;") == "&amp;\\#124;"
    assert markdown_inline(f"v{OSC_TITLE}") == "v\\\\x1b\\]0;evil\\\\x07"
    # indented: " -" is an empty list item, four spaces a code block (hypothesis found the first)
    assert markdown_inline(" -") == "&#32;\\-" and markdown_inline("    x") == "&#32;" * 4 + "x"
    for value in (" -", "  1. x", "    x"):
        assert _types(MD.parse(markdown_inline(value) + "\n")) == [
            "paragraph_open", "inline", "text", "paragraph_close"], value


def _record_facts(version: str, model: str, inventory: str) -> dict:
    client = {"completion_rate": 1.0, "completed": 8, "requests": 8, "output_tokens_per_s": 9,
              "errors": {}, **{k: {"p50": 0.1, "p90": 0.2, "p99": 0.3}
                               for k in ("ttft_s", "itl_s", "e2e_s")}}
    cond = {"model": model, "dtype": "auto", "tensor_parallel_size": 1,
            "pipeline_parallel_size": 1, "vllm_version": version,
            "hosts": [{"host": "h1", "address": "10.0.0.1"}], "start_to_serving_s": 30.0,
            "inputs": {"digest": "d", "requests": 8, "concurrency": 2, "rate": None,
                       "prompt_tokens": 5, "max_tokens": 6, "seed": 1},
            "placement": {"kind": "ranks", "ranks": [{"rank": 0, "host": "h1", "gpus": [0]}]}}
    fault = {"recovery": {"served_throughout": False, "recovered_s": 4.0, "bound_s": 60,
                          "first_failure_s": 1.0},
             "target": {"signal": "KILL", "reboot": False, "partition_s": 0, "rank": 0},
             "time": "t", "start_limit_hit": [],
             "streams": [{"fate": "error", "tokens": 3, "error": version, "detail": version}]}
    return {"inventory": inventory, "replica": "llm", "backend": "mp", "pool": "dedicated",
            "reserves": "r", "starts": "s", "faults": {"h1:vllm.service": fault},
            "bench": {"conditions": cond, "client": client, "time": "t", "agreement": {
                k: {"agrees": True} for k in ("ttft_s", "itl_s", "e2e_s")}}}


@given(HOSTILE | st.text(alphabet="|\\`*_[]<>&#\n-", max_size=20), st.text(max_size=20))
@settings(max_examples=25, deadline=None)
def test_a_server_cannot_forge_the_decision_record(version: str, model: str) -> None:
    from vllm_provision.evidence import record

    plain = record.render(_record_facts("0.11.0", "m", "inv.yml"))
    forged = record.render(_record_facts(version, model, f"inv|{version}.yml"))
    assert bad_chars(forged, allowed="\n") == []
    shape = [_types(MD.parse(text)) for text in (plain, forged)]
    for kind in ("heading_open", "tr_open", "td_open", "th_open", "list_item_open",
                 "paragraph_open", "html_inline", "html_block", "link_open"):
        assert shape[0].count(kind) == shape[1].count(kind), kind
