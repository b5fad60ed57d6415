"""Time the Ray placement-group search of ``provision check`` (checks/placement.py) on clusters
of up to 16 nodes x 8 GPUs: vLLM's own bundles and custom shapes, feasible and not.

Goal (bench/README.md, "Placement search"): every case decided in under 50 ms. Pure CPU, no lab:

    .venv/bin/python bench/placement.py                      # all cases, table + JSON
    .venv/bin/python bench/placement.py --rounds 9 --only 665 887

The code measured is whichever ``vllm_provision`` the interpreter imports, so an older revision
is timed from an export of it (``git archive REV | tar -x -C DIR``) with ``PYTHONPATH=DIR``;
``--timeout-s`` then runs each case in a child process and stops it after that many seconds
(the search before the counted one never ended on some cases). Raw samples go to
``bench/results/placement.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_provision.checks import placement

Case = tuple[str, str, Callable[[], tuple[list[dict[str, float]], str, dict[str, Any]]]]
HEAD = "10.0.0.1"
GOAL_MS = 50.0


def cluster(*gpus: int, cpus: int | None = None) -> dict[str, dict[str, float]]:
    """Nodes h1..hN with these GPU counts; node i has IP 10.0.0.<i+1>, h1 is the head."""
    return {f"h{i + 1}": placement.node_resources(g, f"10.0.0.{i + 1}", cpus)
            for i, g in enumerate(gpus)}


def vllm(tp: int, pp: int, *gpus: int) -> Callable[[], tuple]:
    return lambda: (placement.vllm_bundles(tp * pp, HEAD), "PACK", cluster(*gpus))


def custom(shapes: list[tuple[dict[str, float], int]], strategy: str, *gpus: int,
           cpus: int | None = None) -> Callable[[], tuple]:
    return lambda: ([dict(shape) for shape, count in shapes for _ in range(count)], strategy,
                    cluster(*gpus, cpus=cpus))


SIXTEEN = (8,) * 16
CASES: list[Case] = [
    ("665", "vLLM TP=6 PP=3 on 6+6+5 (short 1 GPU)", vllm(6, 3, 6, 6, 5)),
    ("887", "vLLM TP=8 PP=3 on 8+8+7 (short 1 GPU)", vllm(8, 3, 8, 8, 7)),
    ("pp-typo", "vLLM TP=8 PP=4 on 3 x 8 (short 8 GPUs)", vllm(8, 4, 8, 8, 8)),
    ("888", "vLLM TP=8 PP=3 on 3 x 8", vllm(8, 3, 8, 8, 8)),
    ("16x8", "vLLM TP=8 PP=16 on 16 x 8 (128 ranks)", vllm(8, 16, *SIXTEEN)),
    ("16x8-lost", "vLLM TP=8 PP=16 on 15 x 8 + 7", vllm(8, 16, *(8,) * 15, 7)),
    ("16x8-tp4", "vLLM TP=4 PP=31 on 15 x 8 + 4 (124 ranks)", vllm(4, 31, *(8,) * 15, 4)),
    ("3gpu-32", "32 x {GPU: 3} PACK on 16 x 8", custom([({"GPU": 3}, 32)], "PACK", *SIXTEEN)),
    ("3gpu-33", "33 x {GPU: 3} PACK on 16 x 8 (totals fit, bundles do not)",
     custom([({"GPU": 3}, 33)], "PACK", *SIXTEEN)),
    ("mix-fill", "16 x {GPU: 4} + 24 x {GPU: 2} + 16 x {GPU: 1} PACK on 16 x 8 (exact fill)",
     custom([({"GPU": 4}, 16), ({"GPU": 2}, 24), ({"GPU": 1}, 16)], "PACK", *SIXTEEN)),
    ("mix-5-4", "16 x {GPU: 5} + 12 x {GPU: 4} PACK on 16 x 8 (totals fit, bundles do not)",
     custom([({"GPU": 5}, 16), ({"GPU": 4}, 12)], "PACK", *SIXTEEN)),
    ("hetero", "8 x {GPU: 6} + 8 x {GPU: 3} + 24 x {GPU: 1} SPREAD on 8 x 8 + 8 x 4",
     custom([({"GPU": 6}, 8), ({"GPU": 3}, 8), ({"GPU": 1}, 24)], "SPREAD",
            *(8,) * 8, *(4,) * 8)),
    ("hetero-no", "8 x {GPU: 6} + 8 x {GPU: 3} + 9 x {GPU: 2} SPREAD on 8 x 8 + 8 x 4 "
     "(totals fit, bundles do not)",
     custom([({"GPU": 6}, 8), ({"GPU": 3}, 8), ({"GPU": 2}, 9)], "SPREAD",
            *(8,) * 8, *(4,) * 8)),
    ("five-shapes", "6 x {GPU: 7} + 6 x {GPU: 5} + 6 x {GPU: 3} + 6 x {GPU: 2} + 12 x {GPU: 1} "
     "PACK on 16 x 8",
     custom([({"GPU": 7}, 6), ({"GPU": 5}, 6), ({"GPU": 3}, 6), ({"GPU": 2}, 6),
             ({"GPU": 1}, 12)], "PACK", *SIXTEEN)),
    ("five-no", "6 x {GPU: 7} + 6 x {GPU: 5} + 4 x {GPU: 4} + 6 x {GPU: 3} + 9 x {GPU: 2} "
     "PACK on 16 x 8 (totals fit, bundles do not)",
     custom([({"GPU": 7}, 6), ({"GPU": 5}, 6), ({"GPU": 4}, 4), ({"GPU": 3}, 6),
             ({"GPU": 2}, 9)], "PACK", *SIXTEEN)),
    ("cpu", "128 x {GPU: 1, CPU: 8} PACK on 16 x (8 GPUs, 64 CPUs)",
     custom([({"GPU": 1, "CPU": 8}, 128)], "PACK", *SIXTEEN, cpus=64)),
    ("cpu-short", "128 x {GPU: 1, CPU: 10} PACK on 16 x (8 GPUs, 64 CPUs) (short of CPUs)",
     custom([({"GPU": 1, "CPU": 10}, 128)], "PACK", *SIXTEEN, cpus=64)),
    ("cpu-mix", "64 x {GPU: 1, CPU: 12} + 64 x {GPU: 1, CPU: 4} PACK on 16 x (8 GPUs, 64 CPUs)",
     custom([({"GPU": 1, "CPU": 12}, 64), ({"GPU": 1, "CPU": 4}, 64)], "PACK", *SIXTEEN,
            cpus=64)),
    ("spread-16", "16 x {GPU: 8} STRICT_SPREAD on 16 x 8",
     custom([({"GPU": 8}, 16)], "STRICT_SPREAD", *SIXTEEN)),
    ("spread-no", "16 x {GPU: 4} STRICT_SPREAD on 15 x 8 + 2 (one node too small)",
     custom([({"GPU": 4}, 16)], "STRICT_SPREAD", *(8,) * 15, 2)),
    ("strict-pack", "9 x {GPU: 1} STRICT_PACK on 16 x 8",
     custom([({"GPU": 1}, 9)], "STRICT_PACK", *SIXTEEN)),
]


def decide(make: Callable[[], tuple]) -> tuple[float, bool, str, bool]:
    """Seconds, feasible, reason, decided of one call (the inputs built before the clock)."""
    bundles, strategy, nodes = make()
    start = time.perf_counter()
    decision = placement.decide_placement(bundles, strategy, nodes)
    elapsed = time.perf_counter() - start
    return elapsed, decision.feasible, decision.reason, getattr(decision, "decided", True)


def _child(make: Callable[[], tuple], queue: Any) -> None:
    queue.put(decide(make))


def decide_bounded(make: Callable[[], tuple], timeout_s: float | None):
    """:func:`decide`, or, with ``timeout_s``, in a forked child stopped after that long
    (None then)."""
    if timeout_s is None:
        return decide(make)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(make, queue))
    child.start()
    child.join(timeout_s)
    if child.is_alive():
        child.terminate()
        child.join()
        return None
    return queue.get()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="calls per case (default 7)")
    parser.add_argument("--only", nargs="*", help="case names to run (default all)")
    parser.add_argument("--timeout-s", type=float, help="stop a case after this long")
    parser.add_argument("--label", default="", help="a name for this run in the JSON")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "placement.json")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.only or c[0] in args.only]
    rows = []
    print(f"{'case':<12} {'median ms':>10} {'max ms':>9}  answer")
    for name, text, make in cases:
        samples, answer = [], None
        for _ in range(args.rounds):
            result = decide_bounded(make, args.timeout_s)
            if result is None:
                answer = None
                break
            samples.append(result[0] * 1000)
            answer = result
        if answer is None:
            print(f"{name:<12} {'> ' + format(args.timeout_s, 'g') + ' s':>10}")
            rows.append({"case": name, "what": text, "timed_out_s": args.timeout_s,
                         "samples_ms": samples})
            continue
        median, worst = statistics.median(samples), max(samples)
        verdict = ("undecided" if not answer[3] else "feasible" if answer[1] else "infeasible")
        print(f"{name:<12} {median:>10.2f} {worst:>9.2f}  {verdict}: {answer[2][:90]}")
        rows.append({"case": name, "what": text, "median_ms": round(median, 3),
                     "max_ms": round(worst, 3), "samples_ms": [round(s, 3) for s in samples],
                     "answer": verdict, "reason": answer[2]})
    worst_ms = max((r.get("max_ms", float("inf")) for r in rows), default=0.0)
    print(f"slowest case: {worst_ms:.2f} ms (goal: every case under {GOAL_MS:g} ms)")
    record = {"label": args.label, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "python": platform.python_version(), "load_average": os.getloadavg(),
              "module": placement.__file__, "rounds": args.rounds, "cases": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if worst_ms < GOAL_MS else 1


if __name__ == "__main__":
    sys.exit(main())
