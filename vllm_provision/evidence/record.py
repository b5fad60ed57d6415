"""``provision record``: the deployment decision record, in Markdown, filled only from the
inventory and the stored ``bench`` and ``fault`` results (docs/evidence.md).

Sections: the GPU pool and who reserves the GPUs and starts the workers; what Ray adds here and
what it does not; how traffic returned after each fault; the evidence (start to serving, TTFT,
ITL, completion rate, placement); refusals where two runs' conditions differ; one closing
sentence that can be checked against the numbers above it. With a second inventory, the two
deployments go side by side in one table.

Every value written into the record (a name, a path, a host's or the server's text such as the
vLLM version, every table cell, list item and the closing sentence) goes through
:func:`vllm_provision.core.text.markdown_inline`: it stays literal text on its own line or in its
own cell (no control character, no new cell, row, heading, link or raw HTML).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm_provision import backends, settings
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.text import markdown_inline as md
from vllm_provision.evidence.fabric import describe as describe_link

MISSING = "not measured"


def facts_of(inventory: Any, evidence: Mapping[str, Any], replica: Any) -> dict[str, Any]:
    """What the record says about one deployment: backend, pool, reservation and worker start
    (from the backend's facts), the stored bench, faults and fabric result.

    Raises:
        ProvisionError: no bench result is stored for this inventory.
    """
    bench = evidence.get("bench")
    if not bench:
        raise ProvisionError.single(str(inventory.path), "no bench result is stored",
                                    fix=f"run `provision bench -i {inventory.path}` first")
    ray = replica.backend_type.ray_cluster
    pool = str(settings.master_settings(replica)["vllm_gpu_pool"])
    return {"inventory": str(inventory.path), "replica": replica.name,
            "backend": replica.backend, "pool": pool,
            "reserves": ("Ray's placement group (one one-GPU bundle per worker, created "
                         "by vLLM on the head) inside GPUs our units give Ray"
                         if ray else "nobody besides the platform: our units run on the "
                         "machines the inventory names, every GPU of TP x PP"),
            "starts": ("our units start the Ray head and workers (ranks from the inventory), "
                       "vLLM on the head starts one Ray actor per bundle"
                       if ray else "our units start every node (--node-rank from the "
                       "inventory's vllm_node_rank, rank 0 with the API, the others "
                       "--headless)"),
            "bench": bench, "faults": evidence.get("faults") or {},
            "fabric": evidence.get("fabric")}


def fabric_rows(facts: Mapping[str, Any]) -> list[str]:
    """One markdown line per measured pair of the stored ``provision fabric`` result, or one
    line saying there is none (a link never measured is not a figure that is missing)."""
    result = facts.get("fabric")
    if not isinstance(result, Mapping) or not result.get("pairs"):
        return ["- No `provision fabric` result is stored: the link between the nodes was "
                "not tested."]
    return [f"- {md(describe_link(pair))} ({md(result.get('time'))})"
            for pair in result["pairs"]]


def _ms(value: Any) -> str:
    return MISSING if value is None else f"{float(value) * 1000:.1f} ms"


def _s(value: Any) -> str:
    return MISSING if value is None else f"{float(value):.1f} s"


def _start(starts: Mapping[str, Any], kind: str) -> str:
    """A recorded start of ``kind`` (cold or warm) in seconds, or ``none yet``: a kind that has
    not happened is not a measurement that is missing."""
    item = starts.get(kind)
    value = item.get("start_to_serving_s") if isinstance(item, Mapping) else None
    return "none yet" if value is None else f"{float(value):.1f} s"


def placement_key(bench: Mapping[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """The physical placement as sorted ``(host, GPU indexes)`` per node, the same shape for
    ranks and bundles, so two backends' placements compare."""
    placement = bench["conditions"]["placement"]
    per_host: dict[str, set[int]] = {}
    if placement.get("kind") == "bundles":
        for b in placement.get("bundles", []):
            per_host.setdefault(b["host"], set()).update(b.get("gpus") or [])
    else:
        for r in placement.get("ranks", []):
            per_host.setdefault(r["host"], set()).update(r.get("gpus") or [])
    return sorted((h, tuple(sorted(g))) for h, g in per_host.items())


def describe_placement(bench: Mapping[str, Any]) -> str:
    """``h1 GPUs 0,1,2,3; h2 GPUs 0,1,2,3`` (with ``(n bundles)`` for Ray)."""
    parts = [f"{h} GPUs {','.join(map(str, g)) or 'none seen'}" for h, g in placement_key(bench)]
    kind = bench["conditions"]["placement"].get("kind")
    count = len(bench["conditions"]["placement"].get(kind, []))
    return "; ".join(parts) + f" ({count} {kind})"


def refusals(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Where the two benches were not run under the same conditions: model, dtype, sizes,
    vLLM version, hosts, inputs (the seeded inputs' digest and load), placement. Each is a
    sentence saying what differs and that no difference is attributed to the backend."""
    ca, cb = a["bench"]["conditions"], b["bench"]["conditions"]
    out = []
    for key, label in (("model", "model"), ("dtype", "dtype"),
                       ("tensor_parallel_size", "tensor parallel size"),
                       ("pipeline_parallel_size", "pipeline parallel size"),
                       ("vllm_version", "vLLM version")):
        if ca[key] != cb[key]:
            out.append(f"The {label} differs ({ca[key]} vs {cb[key]}): no difference is "
                       "attributed to the backend.")
    if [h["address"] for h in ca["hosts"]] != [h["address"] for h in cb["hosts"]]:
        out.append("The hosts differ: no difference is attributed to the backend.")
    ia, ib = ca["inputs"], cb["inputs"]
    for key in ("digest", "requests", "concurrency", "rate"):
        if ia.get(key) != ib.get(key):
            out.append(f"The inputs differ ({key}: {ia.get(key)} vs {ib.get(key)}): no latency "
                       "difference is attributed to the backend.")
            break
    if placement_key(a["bench"]) != placement_key(b["bench"]):
        out.append(f"The GPU placement differs ({describe_placement(a['bench'])} vs "
                   f"{describe_placement(b['bench'])}): a change in placement, not the "
                   "backend, may explain a performance difference.")
    return out


def describe_inputs(inputs: Mapping[str, Any]) -> str:
    """The seeded inputs in words."""
    rate = (f"Poisson {inputs['rate']:g}/s" if inputs.get("rate") is not None
            else "no rate limit")
    return (f"{inputs['requests']} requests, concurrency {inputs['concurrency']}, {rate}, "
            f"{inputs['prompt_tokens']} prompt words, {inputs['max_tokens']} output tokens, "
            f"seed {inputs['seed']}, digest {inputs['digest']}")


def fault_rows(facts: Mapping[str, Any]) -> list[str]:
    """One line per stored fault: target, recovery, in-flight fates, start limits."""
    from vllm_provision.evidence.fault import describe_fate

    lines = []
    for target, res in sorted(facts["faults"].items()):
        rec = res["recovery"]
        how = (res["target"]["signal"] and f"SIG{res['target']['signal']}") or (
            "reboot" if res["target"]["reboot"] else f"partition {res['target']['partition_s']} s")
        back = ("served throughout" if rec["served_throughout"] else
                f"serving again {_s(rec['recovered_s'])} after the fault" if rec["recovered_s"]
                is not None else f"not serving again within {rec['bound_s']:g} s")
        fates = "; ".join(describe_fate(s) for s in res["streams"])
        limit = ", ".join(res["start_limit_hit"]) or "none"
        lines.append("- " + md(f"{how} to {target} (rank {res['target']['rank']}, "
                                f"{res['time']}): {back}; first failed request "
                                f"{_s(rec['first_failure_s'])} after it; in flight: {fates}; "
                                f"start limit hit: {limit}."))
    return lines


def best_fault(facts: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """The stored fault on a node other than rank 0 (the headless node or Ray worker) that
    recovered, else any that recovered; None when none did."""
    done = [(t, r) for t, r in sorted(facts["faults"].items())
            if r["recovery"]["recovered_s"] is not None]
    others = [(t, r) for t, r in done if r["target"]["rank"] != 0]
    return (others or done)[0] if (others or done) else None


def closing(facts: Mapping[str, Any]) -> str:
    """The one checkable sentence: keep this backend, who reserves the GPUs, who starts the
    nodes, and the measured recovery of a killed node and completion rate (or what was not
    measured)."""
    backend = backends.find(facts["backend"])
    title = (backend.title or backend.name) if backend else str(facts["backend"])
    reserves = backend.gpu_reservation if backend else None
    verb = f"Keep {title}"
    if facts["pool"] == "shared" and not reserves:
        verb = f"Reconsider {title}"
    elif facts["pool"] == "dedicated" and reserves:
        verb = f"Reconsider {title}"
    who = (reserves if reserves
           else "the platform reserves the GPUs (pool: dedicated)" if facts["pool"] ==
           "dedicated" else "nothing reserves the GPUs in a shared pool")
    client = facts["bench"]["client"]
    found = best_fault(facts)
    if found:
        target, res = found
        how = f"SIG{res['target']['signal']}" if res["target"]["signal"] else "fault"
        recovery = (f"a {how} to {target} was serving again in "
                    f"{res['recovery']['recovered_s']:.0f} s")
    else:
        recovery = "no fault experiment recovered"
    return (f"{verb}: {who}, our units start all {len(facts['bench']['conditions']['hosts'])} "
            f"nodes, {recovery}, and {client['completed']} of {client['requests']} benchmark "
            f"requests completed.")


def render(facts: Mapping[str, Any], other: Mapping[str, Any] | None = None) -> str:
    """The Markdown record (module doc); ``other``: a second deployment for side by side."""
    runs = [facts] + ([other] if other else [])
    lines = [f"# Deployment decision record: replica {md(facts['replica'])}", "",
             "Filled by `provision record` from the inventory and the stored `provision bench` "
             "and `provision fault` results; nothing in it is typed by hand.", ""]
    lines += ["## GPU pool, reservation, workers", "",
              "| | " + " | ".join(md(f"{r['backend']} ({r['inventory']})") for r in runs)
              + " |",
              "|---|" + "---|" * len(runs)]
    for key, label in (("pool", "GPU pool (`vllm_gpu_pool`)"), ("reserves", "who reserves the "
                       "GPUs"), ("starts", "who starts the workers and assigns node identity")):
        lines.append(f"| {label} | " + " | ".join(md(r[key]) for r in runs) + " |")
    lines += ["", "## What Ray adds here, and what it does not", "",
              "- Adds: reservation of every GPU as a placement group before any worker starts "
              "(what a shared pool needs: no half-started gang), and a place in an existing "
              "Ray environment (its dashboard, jobs and tooling).",
              "- Does not add: autoscaling (Ray Serve and node autoscaling are separate steps "
              "this replica does not take); it does not replace NCCL (the tensor and pipeline "
              "traffic between GPUs is NCCL's with either backend); it adds a runtime (GCS, "
              "raylets) whose failures also stop the replica.", ""]
    lines += ["## How traffic returned after a failure", ""]
    for r in runs:
        rows = fault_rows(r)
        lines += [f"{md(r['backend'])}:", ""] + (rows or [f"- {MISSING}: no `provision fault` "
                                                      "result stored."]) + [""]
    lines += ["## The link between the nodes", ""]
    for r in runs:
        lines += [f"{md(r['backend'])}:", ""] + fabric_rows(r) + [""]
    lines += ["## The evidence", "",
              "| | " + " | ".join(md(r["backend"]) for r in runs) + " |",
              "|---|" + "---|" * len(runs)]
    table: list[tuple[str, Any]] = [
        ("model, dtype", lambda b: f"{b['conditions']['model']}, {b['conditions']['dtype']}"),
        ("TP x PP", lambda b: f"{b['conditions']['tensor_parallel_size']} x "
                              f"{b['conditions']['pipeline_parallel_size']}"),
        ("vLLM", lambda b: b["conditions"]["vllm_version"]),
        ("hosts", lambda b: ", ".join(f"{h['host']} ({h['address']})"
                                      for h in b["conditions"]["hosts"])),
        ("inputs", lambda b: describe_inputs(b["conditions"]["inputs"])),
        ("start to serving (last `up`)", lambda b: _s(b["conditions"]["start_to_serving_s"])),
        ("cold / warm start to serving", lambda b: " / ".join(
            _start(b["conditions"].get("starts") or {}, kind) for kind in ("cold", "warm"))),
        ("completion rate", lambda b: f"{b['client']['completion_rate']:.2%} "
                                      f"({b['client']['completed']}/{b['client']['requests']})"),
        ("TTFT p50 / p90 / p99", lambda b: " / ".join(_ms(b["client"]["ttft_s"][f"p{q}"])
                                                      for q in (50, 90, 99))),
        ("ITL p50 / p90 / p99", lambda b: " / ".join(_ms(b["client"]["itl_s"][f"p{q}"])
                                                     for q in (50, 90, 99))),
        ("end-to-end p50 / p90 / p99", lambda b: " / ".join(_ms(b["client"]["e2e_s"][f"p{q}"])
                                                            for q in (50, 90, 99))),
        ("output tokens/s", lambda b: f"{b['client']['output_tokens_per_s']}"),
        ("errors", lambda b: ", ".join(f"{k}: {v}" for k, v in b["client"]["errors"].items())
         or "none"),
        ("/metrics agrees (TTFT, ITL, E2E)", lambda b: ", ".join(
            str(b["agreement"][k]["agrees"]) for k in ("ttft_s", "itl_s", "e2e_s"))),
        ("GPU placement", describe_placement),
        ("measured at", lambda b: b["time"]),
    ]
    for label, read in table:
        lines.append(f"| {label} | " + " | ".join(md(read(r["bench"])) for r in runs) + " |")
    lines += ["", "## Refusals", ""]
    refused = refusals(facts, other) if other else []
    lines += [f"- {md(text)}" for text in refused] or (
        ["- None: model, dtype, sizes, vLLM version, hosts, inputs and GPU placement were the "
         "same, so a difference above may be attributed to the backend."] if other else
        ["- No second deployment was compared (`--compare`): nothing is attributed to a "
         "backend."])
    lines += ["", "## Decision", "", md(closing(facts))]
    if other:
        lines += ["", f"Compared with {md(other['backend'])}: {md(closing(other))}"]
    return "\n".join(lines) + "\n"


def check_complete(text: str, placeholders: Sequence[str] = ("TODO", "TBD", "{", "}",
                                                                "None |", "| None")) -> None:
    """Refuse a record holding a placeholder (a template slot left open).

    Raises:
        ProvisionError: a placeholder was found (a bug: every row is filled from data).
    """
    for mark in placeholders:
        if mark in text:
            raise ProvisionError.single("provision record", f"the record holds {mark!r}",
                                        fix="report this: every row must come from data")
