"""Bounds of the inventory loader and host patterns against hostile or broken input: huge host
ranges, too many hosts, quadratic error collection, symbolic link loops, regular expressions
that backtrack without end. Each case ends in a located problem, never a traceback or a hang;
nothing here measures time (bench/ does): costs are counted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_provision.core.errors import InventoryError, Problem, ProvisionError
from vllm_provision.inventory import folders, load_inventory, ranges, select_hosts, tree
from vllm_provision.inventory.patterns import MAX_REGEX_CHOICES, check_regex, split_pattern
from vllm_provision.inventory.source import Problems

HUGE_END = "100000000000000000000"  # 21 digits: len(range(...)) overflowed a C ssize_t


def _error(path: Path) -> str:
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    return caught.value.render()


# --- host ranges: counted as numbers before any expansion ---------------------------------

@pytest.mark.parametrize(("name", "text", "expected"), [
    pytest.param("inventory.yml",
                 f"all:\n  children:\n    gpus:\n      hosts:\n        node[1:{HUGE_END}]:\n",
                 [f'{{path}}:5: all.children.gpus.hosts["node[1:{HUGE_END}]"]',
                  f"the range [1:{HUGE_END}] names", "fix: correct the range in brackets"],
                 id="yaml-names-file-entry-range-and-cap"),
    pytest.param("hosts.ini", f"[gpus]\nnode[1:{HUGE_END}] ansible_user=ops\n",
                 [f"{{path}}:2: [gpus] node[1:{HUGE_END}]"],
                 id="ini-names-file-line-group-and-range"),
])
def test_a_21_digit_range_end_is_refused_with_its_place_and_the_cap(
        tmp_path: Path, name: str, text: str, expected: list[str]) -> None:
    path = tmp_path / name
    path.write_text(text)
    rendered = _error(path)
    for part in expected:
        assert part.format(path=path) in rendered
    assert f"more than {ranges.MAX_RANGE_HOSTS}" in rendered


def test_range_ends_longer_than_a_dns_label_are_refused_before_int() -> None:
    end = "9" * 5000  # int() of it would raise "exceeds the limit for integer string conversion"
    with pytest.raises(ranges.HostRangeError,
                       match="the end of the range .* has 5000 digits, more than 63"):
        ranges.parse_host_pattern(f"h[1:{end}]")
    with pytest.raises(ranges.HostRangeError, match="the step of the range .* has 64 digits"):
        ranges.parse_host_pattern(f"h[1:9:{'1' * 64}]")


@pytest.mark.parametrize(("pattern", "count"), [
    ("gpu1", 1), ("gpu[01:16]", 16), ("h[0:10:2]", 6), ("r[1:10]-g[a:c]", 30),
    ("n[x:B]", 5),  # Ansible's letter order: string.ascii_letters, a-z then A-Z
    (f"h[{HUGE_END}:{HUGE_END}]", 1),
])
def test_an_entry_is_counted_without_expanding_it(pattern: str, count: int) -> None:
    assert ranges.parse_host_pattern(pattern)[1] == count
    assert len(ranges.expand_host_range(pattern)) == count


def test_ranges_of_one_entry_are_capped_together() -> None:
    with pytest.raises(ranges.HostRangeError, match="its ranges together name 1000000 hosts"):
        ranges.parse_host_pattern("h[1:1000]-[1:1000]")


# --- hosts in all: checked host by host, and the ranges' total --------------------------

def test_two_ranges_at_the_cap_are_refused_at_the_first_host_over_it(tmp_path: Path,
                                                                      monkeypatch) -> None:
    created: list[str] = []
    real = tree.HostNode

    def counting(name: str, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        created.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(tree, "HostNode", counting)
    path = tmp_path / "inventory.yml"
    path.write_text("all:\n  hosts:\n    a[1:10000]:\n    b[1:10000]:\n    c[1:10000]:\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    problems = caught.value.problems
    assert len(problems) == 1
    assert problems[0].where == f'{path}:4: all.hosts["b[1:10000]"]'
    assert f"more than {tree.MAX_HOSTS} hosts (host 'b1' would be number 10001)" in (
        problems[0].message)
    assert len(created) == tree.MAX_HOSTS  # never a host over the cap, c[...] never expanded


def test_the_host_cap_counts_every_file_of_an_inventory_folder(tmp_path: Path,
                                                               monkeypatch) -> None:
    monkeypatch.setattr(tree, "MAX_HOSTS", 5)
    folder = tmp_path / "inventory"
    folder.mkdir()
    (folder / "a.yml").write_text("all:\n  hosts:\n    a[1:3]:\n")
    (folder / "b.ini").write_text("[web]\nb[1:3]\n")
    text = _error(folder)
    assert f"{folder / 'b.ini'}:2: [web] b[1:3]" in text and "host 'b3' would be number 6" in text


def test_many_groups_repeating_one_range_are_bounded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tree, "MAX_EXPANDED", 25)
    path = tmp_path / "inventory.yml"
    path.write_text("all:\n  children:\n" + "".join(
        f"    g{i}:\n      hosts:\n        h[1:10]:\n" for i in range(5)))
    text = _error(path)
    assert "all.children.g2.hosts" in text
    assert "the range entries of the inventory name more than 25 host names" in text


def test_a_group_of_thousands_of_hosts_is_built_with_linear_comparisons() -> None:
    """``host in list`` per host made the loader quadratic; sets keep it linear. Counted with a
    str whose == is counted (a set finds an identical object without calling it)."""
    calls = [0]

    class Name(str):
        __hash__ = str.__hash__

        def __eq__(self, other: object) -> bool:
            calls[0] += 1
            return str.__eq__(self, other)

    count = 3000
    built = tree.Tree(file="t")
    gpus = built.group("gpus", ("gpus",))
    problems = Problems()
    for i in range(count):
        name = Name(f"h{i}")
        assert built.host(name, (name,), problems, "t") is not None
        gpus.add_host(name)
        gpus.add_host(name)  # a repeat is noticed, not appended
    built.group("all", ("all",))
    assert tree.finish_tree(built, problems, str) is built
    groups = [built.groups_of(h) for h in built.hosts]
    assert groups[-1] == ["all", "gpus"] and len(gpus.hosts) == count
    assert calls[0] <= 10 * count, calls[0]  # the list scans took ~count**2 / 2 = 4.5M


def test_problems_are_collected_with_linear_comparisons(monkeypatch) -> None:
    calls = [0]
    real_eq = Problem.__eq__

    def counting_eq(self: Problem, other: object) -> bool:
        calls[0] += 1
        return real_eq(self, other)

    monkeypatch.setattr(Problem, "__eq__", counting_eq)
    problems = Problems()
    count = 5000
    for i in range(count):
        problems.add(f"h{i}", "host has no vllm_host_ip", fix="set it")
        problems.add(f"h{i}", "host has no vllm_host_ip", fix="set it")  # a repeat: kept once
    assert len(problems.items) == count
    assert calls[0] <= 2 * count, calls[0]  # the list scan took ~count**2 = 25M


def test_groups_and_memberships_are_capped(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tree, "MAX_GROUPS", 50)
    many = tmp_path / "groups.ini"
    many.write_text("[base]\nh[1:5]\n" + "".join(f"[g{i}:children]\nbase\n" for i in range(60)))
    text = _error(many)
    assert "the inventory defines more than 50 groups (group 'g47' would be number 51)" in text
    monkeypatch.setattr(tree, "MAX_GROUPS", 10_000)
    monkeypatch.setattr(tree, "MAX_MEMBERSHIPS", 200)  # 5 hosts x (base, g0..g59, all) = 310
    assert "the hosts' group memberships pass 200" in _error(many)
    monkeypatch.setattr(tree, "MAX_MEMBERSHIPS", 310)
    inventory = load_inventory(many)
    assert len(inventory.hosts["h5"].groups) == 62
    assert [h.name for h in select_hosts(inventory, "g5*")] == [f"h{i}" for i in range(1, 6)]


def test_a_deep_chain_of_ini_groups_neither_recurses_nor_loops(tmp_path: Path) -> None:
    path = tmp_path / "hosts.ini"
    path.write_text("[g0]\nh1\n" + "".join(f"[g{i}:children]\ng{i - 1}\n" for i in range(1, 3000)))
    inventory = load_inventory(path)
    assert inventory.hosts["h1"].groups[:3] == ("all", "g2999", "g2998")
    cycle = tmp_path / "cycle.ini"
    cycle.write_text("[a]\nh1\n" + "".join(f"[g{i}:children]\ng{i + 1}\n" for i in range(2000))
                     + "[g2000:children]\ng0\n")
    assert "groups contain each other: g0 -> g1" in _error(cycle)


RANGE_TEXT = st.text(alphabet="0123456789:abzAZ-", max_size=30)


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=st.sampled_from(["gpu", "n-", "", "h."]), body=RANGE_TEXT,
       tail=st.sampled_from(["", ".lab", "[1:2]", "-[a:c]"]), ini=st.booleans())
def test_random_host_ranges_load_or_give_a_located_error(tmp_path: Path, head: str, body: str,
                                                         tail: str, ini: bool) -> None:
    pattern = f"{head or ('h' if ini else '')}[{body}]{tail}"  # INI: '[x]' alone is a section
    path = tmp_path / ("hosts.ini" if ini else "inventory.yml")
    path.write_text(f"[web]\n{pattern}\n" if ini else f"all:\n  hosts:\n    '{pattern}':\n")
    try:
        inventory = load_inventory(path)
    except ProvisionError as exc:
        assert all(p.where.startswith(str(path)) and p.fix for p in exc.problems)
        return
    assert 1 <= len(inventory.hosts) <= ranges.MAX_RANGE_HOSTS


# --- symbolic link loops in inventory folders -------------------------------------------

def _inventory_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "inventory"
    (folder / "group_vars" / "all").mkdir(parents=True)
    (folder / "host_vars").mkdir()
    (folder / "hosts.yml").write_text("all:\n  hosts:\n    h1:\n")
    (folder / "group_vars" / "all" / "a.yml").write_text("x: 1\n")
    return folder


@pytest.mark.parametrize(("link", "target", "message"), [
    ("sub/up", "..", "this folder is {folder}, which holds it"),
    ("self", "self", "the link cannot be resolved"),
    ("group_vars/all/back", "..", "this folder is {folder}/group_vars, which holds it"),
    ("group_vars/all/me", "me", "the link cannot be resolved"),
    ("host_vars/h1", "h1", "the link cannot be resolved"),
])
def test_a_symbolic_link_loop_in_an_inventory_folder_is_refused_with_its_path(
        tmp_path: Path, link: str, target: str, message: str) -> None:
    folder = _inventory_folder(tmp_path)
    (folder / link).parent.mkdir(exist_ok=True)
    os.symlink(target, folder / link)
    text = _error(folder)
    assert "symbolic link loop" in text and message.format(folder=folder.resolve()) in text
    where = folder / link if "cannot be resolved" in message else folder / link.split("/")[0]
    assert str(where) in text


def test_a_link_loop_given_with_i_or_as_group_vars_is_refused(tmp_path: Path) -> None:
    os.symlink("loop", tmp_path / "loop")
    assert "symbolic link loop" in _error(tmp_path / "loop")
    (tmp_path / "inventory.yml").write_text("all:\n  hosts:\n    h1:\n")
    os.symlink("group_vars", tmp_path / "group_vars")
    assert f"{tmp_path / 'group_vars'}: the group_vars folder is a symbolic link loop" in _error(
        tmp_path / "inventory.yml")


def test_links_that_fan_out_are_bounded_by_the_folder_cap(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(folders, "MAX_FOLDERS", 20)
    folder = _inventory_folder(tmp_path)
    level = folder / "d0"
    level.mkdir()
    for depth in range(1, 12):  # d0/{a,b} -> d1, d1/{a,b} -> d2 ...: 2**11 paths, no loop
        nxt = folder / f"d{depth}"
        nxt.mkdir()
        for name in "ab":
            os.symlink(nxt, level / name)
        level = nxt
    assert "the inventory folder has more than 20 folders" in _error(folder)


def test_a_deep_folder_tree_is_walked_without_recursion(tmp_path: Path) -> None:
    folder = _inventory_folder(tmp_path)
    made = [folder]
    for _ in range(folders.MAX_FOLDERS + 5):  # deeper than Python's recursion limit (1000)
        made.append(made[-1] / "d")
        made[-1].mkdir()
    try:
        assert f"more than {folders.MAX_FOLDERS} folders" in _error(folder)
    finally:  # shutil.rmtree (pytest's clean-up) recurses once per level: remove them here
        for level in reversed(made[1:]):
            level.rmdir()


# --- -l patterns: ~regex without catastrophic backtracking ------------------------------

@pytest.fixture(scope="module")
def long_names(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    path = tmp_path_factory.mktemp("inv") / "inventory.yml"
    path.write_text(f"all:\n  hosts:\n    {'a' * 252}b:\n    gpu-1:\n    gpu-22:\n")
    return load_inventory(path)


@pytest.mark.parametrize(("regex", "message"), [
    ("(a+)+$", "nested quantifiers"),
    ("(a|aa)*$", "nested quantifiers"),
    ("(a?)*x", "nested quantifiers"),
    (r"(a)\1", "back-reference"),
    ("(?P<n>a)(?P=n)", "back-reference"),
    (".*.*.*x", f"more than {MAX_REGEX_CHOICES}"),
    ("a?" * 9 + "x", "9 repeats ('?', '*', '+', '{m,n}'), more than 8"),
    ("[a-z]*[0-9]*-?x", f"more than {MAX_REGEX_CHOICES}"),
    ("a" * 201, "201 characters, more than 200"),
])
def test_a_regex_that_would_backtrack_for_long_is_refused_before_matching(
        long_names, regex: str, message: str) -> None:  # noqa: ANN001
    assert message in (check_regex(regex) or "")
    with pytest.raises(InventoryError) as caught:
        select_hosts(long_names, f"all,&~{regex}")  # ',' as the separator: ':' may be in it
    text = caught.value.render()
    assert "refused" in text and message in text and "fix:" in text


@pytest.mark.parametrize(("regex", "hosts"), [
    (r"gpu-\d+", ["gpu-1", "gpu-22"]),
    (r"gpu-?[0-9]{2}$", ["gpu-22"]),
    ("(gpu|cpu)-1", ["gpu-1"]),
    (".*b$", ["a" * 252 + "b"]),
    ("(ab)+|gpu-2", ["gpu-22"]),
])
def test_ordinary_regexes_still_select_hosts(long_names, regex: str,  # noqa: ANN001
                                             hosts: list[str]) -> None:
    assert check_regex(regex) is None
    assert [h.name for h in select_hosts(long_names, f"~{regex}")] == hosts


def test_a_very_long_pattern_is_refused(long_names) -> None:  # noqa: ANN001
    with pytest.raises(InventoryError, match="more than 4096"):
        select_hosts(long_names, ",".join(["gpu-1"] * 1000))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # re's "possible nested set" on '[['
@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="ab()|*+?{}[]^$\\.:1,-", max_size=24))
def test_random_regex_terms_select_or_give_a_clear_error(long_names, regex: str) -> None:  # noqa: ANN001
    try:
        chosen = select_hosts(long_names, f"~{regex}")
    except InventoryError as exc:
        assert all(p.fix for p in exc.problems)
        return
    # the pattern is split into terms first (',' or ':' separate them, as in Ansible): each
    # regex term that selected hosts passed the safety rules
    terms = [t.lstrip("!&") for t in split_pattern(f"~{regex}")]
    assert chosen and all(check_regex(t[1:]) is None for t in terms if t.startswith("~"))
