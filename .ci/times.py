"""Where CI's time went: the phases `.ci/run` marked, per tier its tests and their seconds, the
30 slowest tests, the lab modules by cost and the CPU seconds of each lab instance and of the
rest (docs/testing.md keeps the budgets).

    python .ci/times.py build/ci      # phases.tsv, cpu.tsv and unit.xml, standin.xml, real.xml

phases.tsv has one line per phase: name, start and end (Unix seconds), exit code. A junit file
holds one <testcase> per test with its seconds (set-up and tear-down included). cpu.tsv
(``.ci/cpu_sample.sh``) has one line every 10 s: ``<unix s> root=<usec> <instance>=<usec> ...``,
the machine's and each lab instance's CPU time (cgroup v2 ``usage_usec``).
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

TIERS = (("unit", "unit.xml"), ("stand-in", "standin.xml"), ("real", "real-sync.xml"),
         ("real", "real.xml"))


def cases(path: Path) -> list[dict[str, object]]:
    """Every test case of a junit file: ``{"id", "module", "s", "outcome", "why"}`` (``why``: the
    start of a failure's message, empty otherwise)."""
    if not path.is_file():
        return []
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        outcome, why = "passed", []
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "skipped" if child.tag == "skipped" else "failed"
                if child.tag != "skipped":
                    why = (child.get("message") or child.text or "").strip().splitlines()
        found.append({"id": f"{module}::{case.get('name')}", "module": module,
                      "s": float(case.get("time") or 0), "outcome": outcome,
                      "why": " ".join(why[:3])[:400] if outcome == "failed" else ""})
    return found


def workers(folder: Path) -> None:
    """Print, per stand-in worker (``timeline-gw<i>.tsv``: worker, test id, start, end), its
    tests, the seconds its tests ran, when its first test began and its last ended (seconds
    from the tier's first test) and how long it sat idle before the tier's last test ended."""
    lines = [line.split("\t") for path in sorted(folder.glob("timeline-*.tsv"))
             for line in path.read_text(errors="replace").splitlines() if line.count("\t") == 3]
    if not lines:
        return
    first = min(float(line[2]) for line in lines)
    last = max(float(line[3]) for line in lines)
    by_worker: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for worker, _test, start, end in lines:
        by_worker[worker].append((float(start), float(end)))
    print(f"\n{'worker':<8}{'tests':>7}{'busy s':>8}{'first':>7}{'last':>7}{'idle at end':>13}")
    for worker, spans in sorted(by_worker.items()):
        busy = sum(end - start for start, end in spans)
        begun, ended = min(s for s, _ in spans) - first, max(e for _, e in spans) - first
        print(f"{worker:<8}{len(spans):>7}{busy:>8.0f}{begun:>7.0f}{ended:>7.0f}"
              f"{last - first - ended:>13.0f}")


def cpu_samples(folder: Path) -> list[tuple[float, dict[str, float]]]:
    """``cpu.tsv``'s samples: (unix seconds, key -> CPU seconds so far); bad lines are skipped."""
    path = folder / "cpu.tsv"
    samples = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        words = line.split()
        try:
            samples.append((float(words[0]), {k: int(v) / 1e6 for k, v in
                                              (w.split("=", 1) for w in words[1:])}))
        except (IndexError, ValueError):
            continue
    return samples


def used(samples: list[tuple[float, dict[str, float]]], key: str, at: float) -> float | None:
    """CPU seconds of ``key`` at the moment ``at``, between the two samples around it (None
    outside the samples or where one of them lacks ``key``)."""
    for (t0, a), (t1, b) in zip(samples, samples[1:], strict=False):
        if t0 <= at <= t1 and key in a and key in b:
            return a[key] + (b[key] - a[key]) * (at - t0) / max(t1 - t0, 1e-9)
    return None


def module_cpu(folder: Path) -> None:
    """Print each stand-in module's CPU seconds on its worker's lab instance (``gw<i>``'s
    instance is the one named ``...w<i>``) over the module's span, dearest first: what the
    module's hosts used (systemd, SSH, the stand-ins, Ray), not the controller's share."""
    samples = cpu_samples(folder)
    if len(samples) < 2:
        return
    keys = set().union(*(values for _t, values in samples))
    rows = []
    for path in sorted(folder.glob("timeline-gw*.tsv")):
        spans: dict[str, list[float]] = {}
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) != 4:
                continue
            module, start, end = parts[1].split("::")[0], float(parts[2]), float(parts[3])
            span = spans.setdefault(module, [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
        worker = path.stem.split("-")[-1]
        instance = next((k for k in keys if k.endswith("w" + worker[2:])), None)
        for module, (start, end) in spans.items():
            a = used(samples, instance, start) if instance else None
            b = used(samples, instance, end) if instance else None
            if a is not None and b is not None and end - start >= 1:
                rows.append((b - a, end - start, worker, module))
    if rows:
        print("\nstand-in modules by their lab's CPU seconds (cpu s, wall s, worker):")
        for seconds, wall, worker, module in sorted(rows, reverse=True):
            print(f"{seconds:>7.0f}{wall:>8.0f}  {worker:<5} {module}")


def cpu(folder: Path, cores: int) -> None:
    """Print each lab instance's CPU seconds, the rest's (the controller: pytest, ``provision``,
    the unit tier, downloads) and how busy the machine's ``cores`` were, from ``cpu.tsv``. An
    instance's cgroup goes when its lab does: its last sample stands (up to 10 s are lost)."""
    samples = cpu_samples(folder)
    if len(samples) < 2 or "root" not in samples[0][1] or "root" not in samples[-1][1]:
        return
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for _t, values in samples:
        for key, seconds in values.items():
            first.setdefault(key, seconds)
            last[key] = seconds
    wall = samples[-1][0] - samples[0][0]
    total = last["root"] - first["root"]
    # an instance a test booted for a moment (test_lab_lifecycle's) can show a cgroup re-made
    # between two samples: under a CPU-second it is noise, not a row
    labs = {k: last[k] - first[k] for k in last if k != "root" and last[k] - first[k] >= 1}
    print(f"\nCPU seconds ({wall:.0f} s sampled, {cores} cores {100 * total / (wall * cores):.0f} %"
          " busy):")
    for key, seconds in sorted(labs.items(), key=lambda kv: -kv[1]):
        print(f"{seconds:>8.0f}  lab {key}")
    print(f"{total - sum(labs.values()):>8.0f}  the rest (controller, unit tier, downloads)")
    print(f"{total:>8.0f}  all")


def main(folder: Path) -> None:
    """Print the tables for the CI output folder ``folder``, then one closing line counting
    every tier's tests: ``all tiers: N passed, N failed, N skipped``."""
    print("\n== where the time went ==")
    print(f"{'phase':<16}{'wall s':>8}{'exit':>6}")
    phases = folder / "phases.tsv"
    for line in phases.read_text().splitlines() if phases.is_file() else []:
        name, start, end, code = line.split("\t")
        print(f"{name:<16}{float(end) - float(start):>8.0f}{code:>6}")
    print(f"\n{'tier':<10}{'tests':>7}{'passed':>8}{'skipped':>8}{'failed':>8}{'test s':>9}")
    everything = []
    for tier in dict(TIERS):
        found = [c for name, file in TIERS if name == tier for c in cases(folder / file)]
        everything += [(tier, c) for c in found]
        count: dict[str, int] = defaultdict(int)
        for c in found:
            count[str(c["outcome"])] += 1
        print(f"{tier:<10}{len(found):>7}{count['passed']:>8}{count['skipped']:>8}"
              f"{count['failed']:>8}{sum(float(c['s']) for c in found):>9.0f}")
    print("\n30 slowest tests (s):")
    for tier, c in sorted(everything, key=lambda item: -float(item[1]["s"]))[:30]:
        print(f"{float(c['s']):>7.1f}  {tier:<8} {c['id']}")
    print("\nlab modules (s, tests):")
    modules: dict[tuple[str, str], list[float]] = defaultdict(list)
    for tier, c in everything:
        if tier != "unit":
            modules[(tier, str(c["module"]))].append(float(c["s"]))
    for (tier, module), seconds in sorted(modules.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(seconds):>7.0f}  {len(seconds):>3}  {tier:<8} {module}")
    workers(folder)
    cpu(folder, os.cpu_count() or 1)
    module_cpu(folder)
    failed = [(tier, c) for tier, c in everything if c["outcome"] == "failed"]
    if failed:
        print("\nfailed (the tier's log in the folder has the whole report):")
        for tier, c in failed:
            print(f"  {tier:<8} {c['id']}\n           {c['why']}")
    total: dict[str, int] = defaultdict(int)
    for _tier, c in everything:
        total[str(c["outcome"])] += 1
    print(f"\nall tiers: {total['passed']} passed, {total['failed']} failed, "
          f"{total['skipped']} skipped")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/ci"))
