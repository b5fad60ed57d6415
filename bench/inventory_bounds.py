"""Time the inventory loader and host patterns at their bounds (docs/inventory.md, "Inventory
size" and "Host patterns"): the unit tests count work, this measures seconds.

Cases, each timed once on this machine (no lab, no network):

- ``load-10k``: an inventory of 10,000 hosts (two ranges of 5,000), the host cap;
- ``refuse-2x10k``: two ranges of 10,000 hosts, refused at the first host over the cap;
- ``refuse-huge-range``: ``node[1:100000000000000000000]``, refused before expansion;
- ``regex-worst``: the ``~regex`` terms at the repeat budget (8 repeats, 65,536 choices) that
  backtrack most, each matched against 10,000 host names of 253 characters (the longest a name
  may be) that never match.

Goals: each inventory case under 5 s; a ``~regex`` term at most 1 ms per 253-character name
(10 s for 10,000 such names; names of ~20 characters cost a hundredth of it). Usage (from the
repository root)::

    .venv/bin/python bench/inventory_bounds.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from vllm_provision.core.errors import ProvisionError
from vllm_provision.inventory import load_inventory, select_hosts
from vllm_provision.inventory.patterns import check_regex

GOAL_S = 5.0
REGEX_GOAL_S = 10.0  # 1 ms per name, 10,000 names
WORST_REGEXES = [".*.*x", "a?" * 3 + "a*" + "a?" * 4 + "x", "a*" + "a?" * 7 + "x",
                 "a{0,15}" * 4 + "x", "a{0,252}a{0,252}x"]


def _timed(name: str, action, goal: float = GOAL_S) -> bool:  # noqa: ANN001
    started = time.perf_counter()
    try:
        action()
    except ProvisionError:
        pass
    elapsed = time.perf_counter() - started
    print(f"{name:<32} {elapsed:8.3f} s (goal {goal:g} s) {'ok' if elapsed < goal else 'OVER'}")
    return elapsed < goal


def main() -> int:
    """Run every case; exit status 1 when one is over :data:`GOAL_S`."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        cases = {
            "load-10k": "all:\n  hosts:\n    a[1:5000]:\n    b[1:5000]:\n",
            "refuse-2x10k": "all:\n  hosts:\n    a[1:10000]:\n    b[1:10000]:\n",
            "refuse-huge-range": "all:\n  hosts:\n    node[1:100000000000000000000]:\n",
        }
        times = []
        for name, text in cases.items():
            path = root / f"{name}.yml"
            path.write_text(text)
            times.append(_timed(name, lambda p=path: load_inventory(p)))
        long_names = root / "long.yml"
        long_names.write_text("all:\n  hosts:\n    " + "a" * 245 + "[00001:10000]:\n")
        inventory = load_inventory(long_names)
        for regex in WORST_REGEXES:
            assert check_regex(regex) is None, regex
            times.append(_timed(f"regex-worst {regex[:18]}",
                                lambda r=regex: select_hosts(inventory, f"~{r}"), REGEX_GOAL_S))
    return 0 if all(times) else 1


if __name__ == "__main__":
    sys.exit(main())
