"""``vllm_extra_args`` read as vLLM's parser reads it: the options we own are refused in every
spelling vLLM accepts (docs/inventory.md, "vllm_extra_args"; docs/vllm-versions.md).

An option we own is one we render (:data:`RENDERED_OPTIONS`), one with its own variable
(:data:`VARIABLE_OPTIONS`) or one whose value is a secret
(:data:`~vllm_provision.inventory.values.SECRET_OPTIONS`). vLLM's ``FlexibleArgumentParser``
accepts ``--tensor_parallel_size`` for ``--tensor-parallel-size``, and argparse a unique
prefix (``--tensor-parallel``) where the release allows abbreviations, so each word is
resolved against the ``vllm serve`` table of the replica's release (:mod:`~vllm_provision.
settings.vllm_cli`): its ``vllm_version`` pin when set, else the newest release of the table.
Without the table (a broken installation) the exact names are refused, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_provision.inventory.source import Origin, Problems
from vllm_provision.inventory.values import SECRET_OPTIONS, secret_option
from vllm_provision.settings import vllm_cli
from vllm_provision.settings.vllm_cli.argv import (
    ArgvOption,
    abbreviated,
    prefix_of,
    read_argv,
    spelled,
    value_problem,
)

log = logging.getLogger("vllm_provision.inventory")

# Options we render ourselves from the backend and node rank. vLLM rejects nnodes > 1 with the
# ray backend ("nnodes > 1 can only be set when distributed executor backend is mp, uni or
# external_launcher", vllm/config/parallel.py), so they must never be copied between backends.
RENDERED_OPTIONS = {
    "--nnodes": "it is the number of hosts of the replica",
    "--node-rank": "it comes from vllm_node_rank",
    "--headless": "followers (rank > 0) get it automatically with vllm_backend: mp",
    "--distributed-executor-backend": "it comes from vllm_backend",
    "--master-addr": "it is rank 0's vllm_host_ip",
    "--data-parallel-address": "it is rank 0's vllm_host_ip",
    "--data-parallel-start-rank": "it is the node rank x vllm_data_parallel_size_local",
    "--data-parallel-rank": "one endpoint per engine is one replica per engine here: declare "
                            "replicas behind the front door (docs/serving.md)",
    "--data-parallel-external-lb": "one endpoint per engine is one replica per engine here: "
                                   "declare replicas behind the front door (docs/serving.md)",
    "--data-parallel-multi-port-external-lb": "one endpoint per engine is one replica per "
                                              "engine here: declare replicas behind the front "
                                              "door (docs/serving.md)",
    "--data-parallel-backend": "data parallel runs on vLLM's mp processes here "
                               "(vllm_data_parallel_size; Ray data parallel is not a layout: "
                               "docs/serving.md)",
}
# Options that have a variable: one source for each value.
VARIABLE_OPTIONS = {
    "--tensor-parallel-size": "vllm_tensor_parallel_size", "-tp": "vllm_tensor_parallel_size",
    "--pipeline-parallel-size": "vllm_pipeline_parallel_size",
    "-pp": "vllm_pipeline_parallel_size",
    "--max-model-len": "vllm_max_model_len", "--served-model-name": "vllm_served_model_name",
    "--gpu-memory-utilization": "vllm_gpu_memory_utilization",
    "--host": "vllm_api_host", "--port": "vllm_api_port", "--master-port": "vllm_master_port",
    "--model": "vllm_model",
    "--data-parallel-size": "vllm_data_parallel_size",
    "--data-parallel-size-local": "vllm_data_parallel_size_local",
    "--data-parallel-rpc-port": "vllm_data_parallel_rpc_port",
    "--data-parallel-hybrid-lb": "vllm_data_parallel_layout",
}


@dataclass(frozen=True)
class Owned:
    """An option of ours that a word of ``vllm_extra_args`` spells.

    Attributes:
        name: the option as our tables name it (``--nnodes``, ``-tp``, ``--api-key``).
        kind: ``secret``, ``rendered`` or ``variable``.
        detail: the variable to set instead (``secret``, ``variable``) or why we render it.
        via: how the word reaches it, for the message: ``""`` for the name itself, else a
            phrase such as ``"--nnode abbreviates --nnodes for vLLM 0.12.0's parser"``.
    """

    name: str
    kind: str
    detail: str
    via: str = ""


def owner_of(name: str) -> Owned | None:
    """The :class:`Owned` entry of an option name or alias exactly as our tables write it
    (``--api-key``, ``--nnodes``, ``-tp``), or None."""
    if name in SECRET_OPTIONS:
        return Owned(name, "secret", SECRET_OPTIONS[name][1])
    if name in RENDERED_OPTIONS:
        return Owned(name, "rendered", RENDERED_OPTIONS[name])
    if name in VARIABLE_OPTIONS:
        return Owned(name, "variable", VARIABLE_OPTIONS[name])
    return None


def _owner_of_flag(flag: vllm_cli.Flag) -> Owned | None:
    for spelling in flag.spellings():
        owned = owner_of(spelling)
        if owned is not None:
            return owned
    return None


def release_surface(pin: Any) -> tuple[vllm_cli.Surface | None, bool]:
    """The ``vllm serve`` surface ``vllm_extra_args`` is read with, and whether it is the
    pinned release's.

    ``pin`` (``vllm_version``, or None) gives the release when it is a version the table
    covers (a release between two of the table's, or newer than its newest, reads as the
    nearest older one, with a warning logged); otherwise the table's newest release is used
    (a pin older than the table logs a warning).
    Returns ``(None, False)`` when the table cannot be read. Never raises.
    """
    try:
        if pin is not None:
            try:
                surface, warning = vllm_cli.surface(str(pin))
            except ValueError as error:
                surface, warning = None, None
                if vllm_cli.parse_release(str(pin)) is not None:  # older than the table
                    log.warning("vllm_version %r: %s; vllm_extra_args read with the newest "
                                "release's options", str(pin), error)
            if surface is not None:
                if warning:
                    log.warning("vllm_version %r: %s", str(pin), warning)
                return surface, True
        newest = vllm_cli.releases()[-1]
        return vllm_cli.surface(newest)[0], False
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None, False


def owned_word(option: ArgvOption, surface: vllm_cli.Surface) -> Owned | None:
    """The option of ours that ``option`` (read with ``surface``) spells, or None.

    Resolved words are owned when the flag (any of its spellings) is ours; a word the release
    refuses only because it takes no abbreviations is owned when it would abbreviate exactly
    one option of ours. ``via`` names the full option when the word is not written as it.
    """
    word = option.word
    if option.flag is not None:
        owned = _owner_of_flag(option.flag)
        if owned is None:
            return None
        if abbreviated(option):
            via = (f"{word} abbreviates {option.flag.name} for vLLM {surface.release}'s "
                   "parser")
        elif spelled(word) != word:
            via = f"vLLM reads {word} as {spelled(word)}"
        else:
            via = ""
        return Owned(owned.name, owned.kind, owned.detail, via)
    if isinstance(option.error, vllm_cli.UnknownOption) and not surface.allow_abbrev:
        candidates = prefix_of(surface, word)
        if len(candidates) == 1:
            owned = owner_of(candidates[0])
            if owned is not None:
                via = (f"{word} would abbreviate {candidates[0]}, and vLLM "
                       f"{surface.release} takes no abbreviations: \"unrecognized arguments: "
                       f"{word}\"")
                return Owned(owned.name, owned.kind, owned.detail, via)
    return None


def _refuse_owned(owned: Owned, option: str, word: str, has_value: bool, place: str,
                  backend: Any, problems: Problems) -> None:
    from vllm_provision import backends

    via = f" ({owned.via})" if owned.via else ""
    if owned.kind == "secret":
        problems.add(place, f"vllm_extra_args must not contain {option}{via}: its value is a "
                     "secret, and vllm_extra_args is written to the world-readable unit file "
                     "and shown in output",
                     actual=option + (" ********" if has_value else ""),
                     fix=f"remove {option} and its value from vllm_extra_args and set "
                         f"{owned.detail} instead")
    elif owned.kind == "rendered":
        chosen = backends.find(backend)
        note = chosen.extra_args_note() if chosen else ""
        problems.add(place, f"vllm_extra_args must not contain {option}{via}: we render "
                     f"it ourselves ({owned.detail}).{note}",
                     actual=repr(word), fix=f"remove {word!r} from vllm_extra_args")
    else:
        problems.add(place, f"vllm_extra_args must not contain {option}{via}: it has its "
                     f"own variable, {owned.detail}", actual=repr(word),
                     fix=f"remove it and set {owned.detail} instead")


def _check_exact(args: list[str], place_of: Any, backend: Any, problems: Problems) -> None:
    """Without the table: the exact names (``_`` read as ``-``) and the secret options'
    abbreviations (:func:`~vllm_provision.inventory.values.secret_option`)."""
    for index, word in enumerate(args):
        if not word.startswith("-"):
            continue
        option = word.split("=", 1)[0]
        secret = secret_option(option)
        owned = owner_of(secret) if secret else owner_of(spelled(option))
        if owned is not None and secret and secret != spelled(option):
            owned = Owned(owned.name, owned.kind, owned.detail, f"{option} abbreviates {secret}")
        if owned is not None:
            has_value = "=" in word or index + 1 < len(args)
            _refuse_owned(owned, option, word, has_value, place_of(index), backend, problems)


def check_extra_args(args: list[str], origin: Origin | None, backend: Any, problems: Problems,
                     where: str, pin: Any = None) -> None:
    """Record a problem for every word of ``vllm_extra_args`` that vLLM would read as an option
    we own, or would refuse.

    Refused, whatever the release: an option we own in any spelling the release's parser
    accepts (the message says what the word abbreviates); an ambiguous abbreviation (vLLM's
    "ambiguous option: --x could match ..."); an abbreviation of an option of ours in a
    release that takes none. With ``pin`` set (the replica's ``vllm_version``) also: an
    option that release does not have ("unrecognized arguments", naming the release), an
    abbreviation it does not take, and a value outside the option's kind or choices. Without
    a pin, unknown options are left to preflight's ``vllm_serve.options``, which knows the
    installed release.

    Args:
        args: the words of ``vllm_extra_args``.
        origin: where the list was written (each word's place is ``origin.child(index)``).
        backend: the replica's ``vllm_backend`` (for the note on rendered options).
        problems: where problems are recorded.
        where: the place named when ``origin`` is None.
        pin: the replica's ``vllm_version`` (None when unset).
    """
    args = [str(a) for a in args]

    def place_of(index: int) -> str:
        return origin.child(index).where if origin else where

    surface, pinned = release_surface(pin)
    if surface is None:
        _check_exact(args, place_of, backend, problems)
        return
    for option in read_argv(surface, args):
        place = place_of(option.index)
        word = args[option.index]
        secret = secret_option(option.word)
        owned = owned_word(option, surface)
        if owned is None and secret is not None:
            owned = owner_of(secret)
        if owned is not None:
            _refuse_owned(owned, option.word, word, option.value is not None, place, backend,
                          problems)
            continue
        if isinstance(option.error, vllm_cli.AmbiguousOption):
            problems.add(place, f"vllm_extra_args: {option.error}", actual=repr(word),
                         fix="write the option in full: "
                             + " or ".join(option.error.candidates))
            continue
        if option.error is not None:
            _unknown(option, surface, pinned, place, word, problems)
            continue
        if pinned and option.flag is not None:
            _value(option, surface, place, word, problems)


def _unknown(option: ArgvOption, surface: vllm_cli.Surface, pinned: bool, place: str,
             word: str, problems: Problems) -> None:
    candidates = prefix_of(surface, option.word)
    if candidates and not surface.allow_abbrev and pinned:
        problems.add(place, f"vllm_extra_args: unrecognized arguments: {option.word} (vLLM "
                     f"{surface.release} takes no abbreviations; it would abbreviate "
                     f"{', '.join(candidates)})", actual=repr(word),
                     fix="write the option in full: " + " or ".join(candidates))
    elif pinned and not candidates:
        first = vllm_cli.first_release(spelled(option.word))
        problems.add(place, f"vllm_extra_args: {option.error}", actual=repr(word),
                     fix=(f"remove it, or pin (and install) vLLM {first} or later, the first "
                          "release that has it") if first else
                         "remove it (no release this tool knows has it; `vllm serve --help` "
                         "on the node lists the options)")


def _value(option: ArgvOption, surface: vllm_cli.Surface, place: str, word: str,
           problems: Problems) -> None:
    problem = value_problem(option)
    flag = option.flag
    if problem is None or flag is None:
        return
    if option.value is None:
        fix = f"give {flag.name} a value in the next item of vllm_extra_args"
    elif not flag.takes_value:
        fix = f"write {flag.name} alone: it takes no value"
    elif flag.choices:
        fix = f"give {flag.name} one of " + ", ".join(repr(c) for c in flag.choices)
    else:
        fix = f"give {flag.name} a value of kind {flag.kind}"
    shown = repr(word) + ("" if option.inline or option.value is None else f" {option.value!r}")
    problems.add(place, f"vllm_extra_args: {problem} (vLLM {surface.release})", actual=shown,
                 fix=fix)


def pinned_version(agreed: Mapping[str, Any]) -> Any:
    """The replica's ``vllm_version`` from its agreed values, or None when unset or invalid."""
    value = agreed.get("vllm_version")
    return value if isinstance(value, str) and value else None
