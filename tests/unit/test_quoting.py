"""Quoting for a shell, ExecStart= (systemd.service(5)) and EnvironmentFile= (systemd.exec(5))."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.quoting import (
    env_file_line,
    find_control_chars,
    reject_control_chars,
    shell_join,
    shell_quote,
    systemd_exec_quote,
)

CONTROL = ["a\nb", "a\rb", "a\tb", "a\x00b", "a\x1bb", "a\x7fb", "a\u2028b", "\n"]
NASTY = ["plain", "", "two words", "it's", 'say "hi"', "$HOME", "100%", "a\\b", ";", "a;b",
         "--x=$(id)", "`id`", "*", "~", "#comment", "ünïcödé"]


@pytest.mark.parametrize("value", CONTROL)
def test_control_characters_are_found(value: str) -> None:
    assert find_control_chars(value) is not None


@pytest.mark.parametrize("value", NASTY)
def test_printable_values_have_no_control_characters(value: str) -> None:
    assert find_control_chars(value) is None


def test_reject_control_chars_names_where_and_position() -> None:
    with pytest.raises(ProvisionError) as caught:
        reject_control_chars("8000\nExecStartPre=/bin/sh", "inventory.yml: all.vars.x")
    problem = caught.value.problems[0]
    assert problem.where == "inventory.yml: all.vars.x"
    assert "a newline (\\n) at position 4" in problem.message
    assert reject_control_chars("fine", "x") == "fine"


@pytest.mark.parametrize("value", NASTY)
def test_shell_quote_round_trips_through_a_real_shell(value: str) -> None:
    out = subprocess.run(["sh", "-c", f"printf %s {shell_quote(value)}"], capture_output=True,
                         text=True, check=True).stdout
    assert out == value


def test_shell_join_splits_back_to_the_same_words() -> None:
    assert shlex.split(shell_join(NASTY)) == NASTY


@pytest.mark.parametrize("value", CONTROL)
def test_shell_quote_refuses_control_characters(value: str) -> None:
    with pytest.raises(ValueError):
        shell_quote(value)


@pytest.mark.parametrize(("argv", "expected"), [
    (["/opt/vllm/bin/vllm", "serve", "/srv/m"], "/opt/vllm/bin/vllm serve /srv/m"),
    (["/bin/echo", "two words"], '/bin/echo "two words"'),
    (["/bin/echo", ""], '/bin/echo ""'),
    (["/bin/echo", "$HOME"], "/bin/echo $$HOME"),
    (["/bin/echo", "100%"], "/bin/echo 100%%"),
    (["/bin/echo", 'say "hi"'], '/bin/echo "say \\"hi\\""'),
    (["/bin/echo", "a\\b"], '/bin/echo "a\\\\b"'),
    (["/bin/echo", "it's"], '/bin/echo "it\'s"'),
    (["/bin/echo", ";"], "/bin/echo \\;"),
    (["/bin/echo", "a;b"], "/bin/echo a;b"),
    (["/bin/echo", "$ x %"], '/bin/echo "$$ x %%"'),
])
def test_systemd_exec_quote(argv: list[str], expected: str) -> None:
    assert systemd_exec_quote(argv) == expected


@pytest.mark.parametrize("argv", [[], [""], ["-/bin/true"], ["@/bin/true"], ["+/bin/true"],
                                  ["/bin/echo", "x\nExecStartPre=/bin/sh"]])
def test_systemd_exec_quote_refuses(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        systemd_exec_quote(argv)


@pytest.mark.parametrize(("value", "quoted"), [
    ("10.0.0.11", '"10.0.0.11"'),
    ("", '""'),
    (" padded ", '" padded "'),
    ('q"uote', '"q\\"uote"'),
    ("back\\slash", '"back\\\\slash"'),
    ("$HOME and `id`", '"\\$HOME and \\`id\\`"'),
    ("# not a comment; nor this", '"# not a comment; nor this"'),
    ("it's", '"it\'s"'),
])
def test_env_file_line(value: str, quoted: str) -> None:
    assert env_file_line("VLLM_HOST_IP", value) == f"VLLM_HOST_IP={quoted}"


@pytest.mark.parametrize("value", NASTY)
def test_env_file_line_reads_back_in_a_shell(value: str) -> None:
    # systemd's env-file parser follows shell double-quote rules for these escapes.
    script = f"{env_file_line('V', value)}\nprintf %s \"$V\""
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out == value


@pytest.mark.parametrize(("key", "value"), [("1A", "x"), ("A-B", "x"), ("", "x"),
                                            ("A", "x\nExecStartPre=/bin/sh"), ("A", "x\r")])
def test_env_file_line_refuses(key: str, value: str) -> None:
    with pytest.raises(ValueError):
        env_file_line(key, value)


@pytest.mark.parametrize("compress", [False, True])
def test_a_python_loader_is_one_quotable_word_that_runs_the_script_as_main(compress: bool) -> None:
    import subprocess
    import sys

    from vllm_provision.core.quoting import python_loader, quote

    script = ("import sys\nif __name__ == '__main__':\n    print('args', sys.argv[1:])\n"
              "    raise SystemExit(3)\n")
    word = python_loader(script, name="t.py", compress=compress)
    assert quote(word) == "'" + word + "'"  # no quote, space or control character to escape
    done = subprocess.run([sys.executable, "-c", word, "a b"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, check=False)
    assert (done.returncode, done.stdout) == (3, "args ['a b']\n")
    broken = python_loader("raise ValueError('x')\n", name="t.py", compress=compress)
    failed = subprocess.run([sys.executable, "-c", broken], capture_output=True, text=True,
                            check=False)
    assert 'File "t.py", line 1' in failed.stderr  # tracebacks name the script
