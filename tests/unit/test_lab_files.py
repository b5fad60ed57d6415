"""Pure parts of the lab: ssh files, base cache key, missing packages, the delayer's parser."""

from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_provision_lab import base, bootloop, delayer, deps
from vllm_provision_lab.errors import LabError
from vllm_provision_lab.keys import known_hosts_text, ssh_config_text


def test_ssh_config_is_strict_and_uses_lab_files() -> None:
    text = ssh_config_text([("h1", "10.0.0.11"), ("h2", "10.0.0.12")],
                           Path("/s/id_ed25519"), Path("/s/known_hosts"))
    blocks = text.split("\n\n")
    assert len(blocks) == 2
    assert blocks[1].startswith("Host h2 10.0.0.12\n  HostName 10.0.0.12\n")
    for line in ("StrictHostKeyChecking yes", "UserKnownHostsFile /s/known_hosts",
                 "IdentityFile /s/id_ed25519", "IdentitiesOnly yes"):
        assert line in blocks[0]


def test_known_hosts_lists_name_and_address() -> None:
    assert known_hosts_text([("h1", "10.0.0.11", "ssh-ed25519 AAAA")]) == \
        "h1,10.0.0.11 ssh-ed25519 AAAA\n"


@pytest.mark.parametrize(("attribute", "value"), [
    ("RELEASES", {**base.RELEASES, "bookworm": dataclasses.replace(
        base.RELEASES["bookworm"], ray_pin="ray==2.59.0")}),
    ("PACKAGES", (*base.PACKAGES, "nginx")),
    ("CUSTOMISATION_VERSION", base.CUSTOMISATION_VERSION + 1),
])
def test_base_key_changes_with_the_recipe(monkeypatch: pytest.MonkeyPatch, attribute: str,
                                          value: object) -> None:
    key = base.base_key()
    monkeypatch.setattr(base, attribute, value)
    assert base.base_key() != key


def test_each_release_has_its_own_base_key() -> None:
    keys = {suite: base.base_key(suite=suite) for suite in base.RELEASES}
    assert len(set(keys.values())) == len(keys)
    assert all(key.startswith(f"{suite}-") for suite, key in keys.items())


def test_an_unknown_release_is_refused() -> None:
    with pytest.raises(LabError, match="bullseye or bookworm or trixie"):
        base.base_key(suite="buster")
    with pytest.raises(LabError, match="bookworm only"):
        base.base_key("real", "trixie")


def test_base_key_ignores_package_order(monkeypatch: pytest.MonkeyPatch) -> None:
    key = base.base_key()
    monkeypatch.setattr(base, "PACKAGES", tuple(reversed(base.PACKAGES)))
    assert base.base_key() == key


def test_missing_packages_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deps.shutil, "which",
                        lambda cmd: None if cmd in ("zstd", "systemd-nspawn") else f"/x/{cmd}")
    assert deps.missing_packages() == ["systemd-container", "zstd"]
    with pytest.raises(LabError) as caught:
        deps.ensure_packages(install=False)
    assert caught.value.problems[0].actual == "systemd-container, zstd"
    assert "--install-deps" in caught.value.problems[0].fix


def _packet_message(packet_id: int) -> bytes:
    header_attr = delayer.netlink_attribute(delayer.NFQA_PACKET_HDR,
                                            struct.pack("!IHB", packet_id, 0x0800, 3))
    other = delayer.netlink_attribute(9, b"\x01\x02\x03")  # padded to 8 bytes
    body = struct.pack("=BBH", 2, 0, 0) + other + header_attr
    kind = (delayer.NFNL_SUBSYS_QUEUE << 8) | delayer.NFQNL_MSG_PACKET
    return delayer.NLMSG_HEADER.pack(16 + len(body), kind, 0, 0, 0) + body


def test_netlink_attribute_is_padded_to_four_bytes() -> None:
    encoded = delayer.netlink_attribute(1, b"abcde")
    assert len(encoded) == 12 and struct.unpack("=HH", encoded[:4]) == (9, 1)


def test_delayer_reads_every_packet_id_of_a_datagram() -> None:
    data = _packet_message(7) + _packet_message(4242)
    assert list(delayer.packet_ids(data)) == [7, 4242]


def test_delayer_ignores_other_messages_and_truncation() -> None:
    ack = delayer.NLMSG_HEADER.pack(20, delayer.NLMSG_ERROR, 0, 0, 0) + b"\0" * 4
    assert list(delayer.packet_ids(ack + _packet_message(3))) == [3]
    assert list(delayer.packet_ids(_packet_message(3)[:10])) == []


def test_a_process_is_alive_by_its_command_line_and_one_mid_exec_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The boot loop's liveness check (vllm_provision_lab.hosts._alive): this process holds
    "pytest" in its command line; pid 2 (kthreadd, a kernel thread) has an empty one, as a
    process in the middle of execve(2) does, so it is read again until the window ends."""
    import sys
    import time

    from vllm_provision_lab import hosts

    pid_file = tmp_path / "boot.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    assert hosts._alive(pid_file, os.path.basename(sys.argv[0]) or "python")
    assert not hosts._alive(pid_file, "bootloop.py")
    monkeypatch.setattr(hosts, "EXEC_WINDOW_S", 0.3)
    pid_file.write_text("2\n")
    started = time.monotonic()
    assert not hosts._alive(pid_file, "bootloop.py")
    assert time.monotonic() - started >= 0.3


def test_cgroup_removal_goes_bottom_up_and_skips_a_folder_gone_mid_walk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``lab down`` removes a host's cgroup folders deepest first while the guest's systemd may
    remove some of its own: one that is gone by the time it is reached is skipped."""

    from vllm_provision_lab import cgroups

    (tmp_path / "sub" / "h1" / "payload" / "system.slice" / "gone.service").mkdir(parents=True)
    (tmp_path / "sub" / "h2").mkdir()
    walk = os.walk

    def walk_and_vanish(top: object, **kwargs: object):  # type: ignore[no-untyped-def]
        for folder, children, files in walk(top, **kwargs):  # type: ignore[call-overload]
            if folder.endswith("system.slice"):
                (Path(folder) / "gone.service").rmdir()  # the guest removed it meanwhile
            yield folder, children, files

    monkeypatch.setattr(cgroups, "hierarchy_roots", lambda: [tmp_path])
    monkeypatch.setattr(cgroups.os, "walk", walk_and_vanish)
    cgroups.remove("sub")
    assert list(tmp_path.iterdir()) == []


def test_the_boot_loop_sets_the_instances_niceness_before_it_boots(tmp_path: Path) -> None:
    """``--nice`` is applied to the boot loop itself, so nspawn and every guest process inherit
    it; with a stop file there the loop boots nothing and returns."""
    (tmp_path / "stop").touch()
    script = ("import os, sys; sys.path.insert(0, sys.argv[1]); import bootloop; "
              "code = bootloop.main(['--run-dir', sys.argv[2], '--machine', 'm', '--hostname', "
              "'h1', '--netns', 'n', '--nice', '19']); print(os.getpriority(os.PRIO_PROCESS, 0), "
              "code)")
    out = subprocess.run([sys.executable, "-c", script, str(Path(bootloop.__file__).parent),
                          str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["19", "0"]  # raising the niceness needs no privilege
    assert (tmp_path / "boot.pid").read_text().strip().isdigit()
