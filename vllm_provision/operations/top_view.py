"""How ``provision top`` shows its view: lines of styled segments, printed plain (``--once``)
or as ``rich`` text (the live display, in colour).

Every segment is data: it becomes a ``rich.text.Text`` (never parsed as rich markup), and the
text from hosts and servers in it was made printable when the view was built
(:mod:`vllm_provision.operations.top`, :func:`vllm_provision.core.text.printable`), so a unit
state or an ``nvidia-smi`` line holding an escape sequence or ``[bold]`` shows as the characters
it is. docs/monitoring.md, "provision top".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# a line: (text, rich style or "") segments
Line = list[tuple[str, str]]

_STATE_STYLE = {"active": "green", "activating": "yellow", "deactivating": "yellow",
                "failed": "bold red", "inactive": "red"}


def _seconds(value: float | None) -> str:
    """``0.052 s`` as ``52 ms``; ``-`` for None."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _number(value: float | None, fmt: str = "{:g}") -> str:
    return "-" if value is None else fmt.format(value)


def replica_lines(info: Mapping[str, Any]) -> list[Line]:
    """The lines of one replica: a title with serving or not, the engine's numbers, then one
    line per node (GPU memory) and one per unit (state, restarts).

    Args:
        info: one item of the view's ``replicas`` (:func:`~vllm_provision.operations.top.
            replica_view`).
    """
    serving = info["serving"]
    word = ("serving", "bold green") if serving else ("not serving", "bold red")
    health = f" (/health {info['health']})" if info["health"] not in (None, 200) else ""
    lines: list[Line] = [[(f"{info['replica']}", "bold"),
                          (f" {info['backend']} {info['model']}  ", "dim"), word,
                          (health, "red")]]
    if info["error"]:
        lines.append([("  ", ""), (str(info["error"]), "red")])
    if info["metric_names"]:
        lat = info["latency"]
        requests = info["requests"]
        lines.append([
            ("  requests ", "dim"),
            (f"{_number(requests['running'], '{:.0f}')} running, "
             f"{_number(requests['waiting'], '{:.0f}')} waiting", ""),
            ("  KV cache ", "dim"), (_number(info["kv_cache_perc"], "{:.1f} %"),
                                     _kv_style(info["kv_cache_perc"])),
            ("  tokens/s ", "dim"), (_number(info["tokens_per_s"], "{:.1f}"), "cyan")])
        lines.append([
            (f"  latency ({lat['window']}) ", "dim"),
            ("TTFT p50 ", "dim"), (_seconds(lat["ttft_s"]["p50"]), ""),
            (" p99 ", "dim"), (_seconds(lat["ttft_s"]["p99"]), ""),
            ("  ITL p50 ", "dim"), (_seconds(lat["itl_s"]["p50"]), ""),
            (" p99 ", "dim"), (_seconds(lat["itl_s"]["p99"]), "")])
    for node in info["nodes"]:
        lines.append([(f"  {node['host']}", "bold cyan"), (f" rank {node['node_rank']}", "dim")]
                     + _node_tail(node))
        for unit in node["units"]:
            lines.append(_unit_line(unit))
    return lines


def _kv_style(perc: float | None) -> str:
    if perc is None:
        return ""
    return "red" if perc >= 95 else "yellow" if perc >= 80 else "green"


def _node_tail(node: Mapping[str, Any]) -> Line:
    if node["error"]:
        return [("  unreachable: ", "bold red"), (str(node["error"]), "red")]
    if node["gpu_error"]:
        return [("  GPUs: ", "dim"), (str(node["gpu_error"]), "yellow")]
    gpus = node["gpus"]
    if not gpus:
        return [("  GPUs: none", "dim")]
    used = sum(g["memory_used_mib"] for g in gpus)
    total = sum(g["memory_total_mib"] for g in gpus)
    each = " ".join(f"{g['index']}:{g['memory_used_mib'] / 1024:.0f}/"
                    f"{g['memory_total_mib'] / 1024:.0f}" for g in gpus)
    return [("  GPU memory ", "dim"), (f"{used / 1024:.1f}/{total / 1024:.1f} GiB", ""),
            (f" ({len(gpus)} GPUs, GiB used/total: {each})", "dim")]


def _unit_line(unit: Mapping[str, Any]) -> Line:
    if unit["active_state"] is None:
        return [(f"    {unit['unit']:<22}", ""), ("not read", "dim")]
    state = f"{unit['active_state']} ({unit['sub_state']})"
    hour = unit["restarts_1h"]
    restarts = (f"restarts: {'-' if hour is None else hour} in the last hour, "
                f"{unit['restarts']} since started (NRestarts)")
    return [(f"    {unit['unit']:<22}", ""),
            (f"{state:<24}", _STATE_STYLE.get(unit["active_state"], "yellow")),
            (restarts, "yellow" if hour else "dim")]


def view_lines(view: Mapping[str, Any]) -> list[Line]:
    """Every line of the view: a header, then each replica's lines, a blank line between."""
    replicas: Sequence[Mapping[str, Any]] = view["replicas"]
    serving = sum(1 for r in replicas if r["serving"])
    lines: list[Line] = [[("provision top", "bold"),
                          (f"  {view['at']}  serving {serving}/{len(replicas)}", "dim")]]
    for info in replicas:
        lines.append([])
        lines.extend(replica_lines(info))
    return lines


def plain(view: Mapping[str, Any]) -> str:
    """The view as plain text (``--once``): no colour, no escape sequence."""
    return "\n".join("".join(text for text, _ in line).rstrip() for line in view_lines(view))


def rich_view(view: Mapping[str, Any]) -> Any:
    """The view as one ``rich`` renderable (the live display): each segment a ``Text`` with its
    style; never parsed as markup."""
    from rich.console import Group
    from rich.text import Text

    rows = []
    for line in view_lines(view):
        text = Text()
        for segment, style in line:
            text.append(segment, style=style or None)
        rows.append(text)
    return Group(*rows)
