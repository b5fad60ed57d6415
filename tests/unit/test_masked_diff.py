"""Diffs of no_log files: line by line, only the secrets masked; hidden when only secrets."""

from __future__ import annotations

from pathlib import Path

import jinja2
from test_runner import run, write_playbook
from test_runner_support import make_inventory

from vllm_provision.core import quoting
from vllm_provision.modules import unified_diff
from vllm_provision.settings.masking import HIDDEN_ONLY_SECRETS, Masker, mask_diff
from vllm_provision.settings.variables import MASK

KEY = "sk-lab-0123456789"


def test_env_file_diff_shows_each_line_with_only_the_key_masked() -> None:
    before = "".join(quoting.env_file_line(k, v) + "\n" for k, v in
                     [("VLLM_HOST_IP", "10.0.0.1"), ("VLLM_API_KEY", KEY),
                      ("NCCL_DEBUG", "WARN")])
    after = before.replace("NCCL_DEBUG=\"WARN\"", "NCCL_DEBUG=\"INFO\"")
    shown = mask_diff(Masker([KEY]), unified_diff(before, after, "/etc/vllm.env"))
    assert KEY not in shown
    assert "-NCCL_DEBUG=\"WARN\"" in shown and "+NCCL_DEBUG=\"INFO\"" in shown
    assert f" VLLM_API_KEY={MASK}" in shown


def test_a_secret_the_masker_does_not_know_is_masked_by_its_name() -> None:
    diff = unified_diff("A=1\n", "A=1\nHF_TOKEN=hf_unknown_to_the_masker\n", "/etc/x.env")
    shown = mask_diff(Masker(), diff)
    assert "hf_unknown" not in shown and f"+HF_TOKEN={MASK}" in shown and " A=1" in shown


def test_json_config_diff_masks_the_api_key_member() -> None:
    render = jinja2.Environment().from_string("{{ c | tojson(indent=2) }}\n").render
    before = render(c={"probe": {"api_key": KEY, "url": "http://h:8000"}, "poll_s": 1.0})
    after = render(c={"probe": {"api_key": KEY, "url": "http://h:8000"}, "poll_s": 2.0})
    shown = mask_diff(Masker([KEY]), unified_diff(before, after, "/etc/watchdog.json"))
    assert KEY not in shown and '"poll_s": 2.0' in shown and f'"api_key": "{MASK}"' in shown


def test_a_file_of_nothing_but_secrets_is_hidden() -> None:
    diff = unified_diff("# secrets\nVLLM_API_KEY=old-key-1\n", f"# secrets\nVLLM_API_KEY={KEY}\n",
                        "/etc/key.env")
    assert mask_diff(Masker([KEY]), diff) == HIDDEN_ONLY_SECRETS


def test_no_log_template_task_diff_is_masked_not_hidden(tmp_path: Path) -> None:
    playbook = write_playbook(tmp_path, """
- hosts: all
  tasks:
    - name: Env file
      template: {src: env.j2, dest: "{{ root }}/vllm.env", mode: "0600"}
      no_log: true
""")
    (playbook.parent / "templates").mkdir()
    (playbook.parent / "templates" / "env.j2").write_text(
        "VLLM_API_KEY={{ vllm_api_key }}\nNCCL_DEBUG={{ level }}\n")
    secrets = {"vllm_api_key": KEY}
    run(make_inventory(tmp_path, ("h1",), extra_vars={**secrets, "level": "WARN"}), playbook)
    runner, summary = run(make_inventory(tmp_path, ("h1",),
                                         extra_vars={**secrets, "level": "INFO"}),
                          playbook, check=True, diff=True)
    [result] = runner.outcome.results
    assert result.message == "(output hidden: no_log)" and result.data is None
    assert "+NCCL_DEBUG=INFO" in result.diff and f" VLLM_API_KEY={MASK}" in result.diff
    assert KEY not in str(summary)
