"""The shipped ``vllm serve`` option table (vllm_provision/settings/vllm_cli/serve_flags.json)
and its generator (scripts/vllm_serve_flags.py), whose ast reading is tested on small
hand-written sources: no network, no vLLM."""

from __future__ import annotations

import ast
import importlib.util
import io
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from vllm_provision.settings import vllm_cli
from vllm_provision.settings.vllm_cli import (
    AmbiguousOption,
    UnknownOption,
    parse_release,
    releases,
    surface,
    table,
)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm_serve_flags.py"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


gen = _load("vllm_serve_flags", SCRIPT)

# The options this tool renders into a vllm serve command line, and the kind each must have.
RENDERED = {"--tensor-parallel-size": "int", "--pipeline-parallel-size": "int",
            "--distributed-executor-backend": "str", "--host": "str", "--port": "int",
            "--served-model-name": "str", "--max-model-len": "str",
            "--gpu-memory-utilization": "float", "--api-key": "str"}


def _first(flag: str) -> str | None:
    """The first release of the shipped table that has ``flag``."""
    spans = table()["flags"].get(flag)
    return releases()[spans[0][0]] if spans else None


# --- the shipped table --------------------------------------------------------------------------


def test_the_shipped_table_loads_with_releases_sorted_from_0_10_0() -> None:
    data = table()
    assert data["format"] == 1 and data["made_by"] == "scripts/vllm_serve_flags.py"
    known = releases()
    assert known[0] == "0.10.0"
    keys = [parse_release(r) for r in known]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert "0.10.1.1" in known  # four-part releases are releases too
    assert all(r.count(".") in (2, 3) and "rc" not in r for r in known)
    assert len(known) >= 40  # 0.10.0 .. 0.34.0 when it was made


def test_every_span_is_inside_the_releases_and_spans_do_not_overlap() -> None:
    data = table()
    count = len(data["releases"])
    for name, spans in data["flags"].items():
        assert name.startswith("--"), name
        last = -1
        for first, end, props in spans:
            assert last < first <= end < count, name
            last = end
            assert props["kind"] in {"int", "float", "str", "json", "bool"}, name
            assert props["takes_value"] == (props["kind"] != "bool"), name
            assert not props["negatable"] or props["kind"] == "bool", name


@pytest.mark.parametrize("release", releases())
def test_every_release_has_the_options_this_tool_renders(release: str) -> None:
    found, warning = surface(release)
    assert warning is None and found.release == release
    for flag, kind in RENDERED.items():
        assert found.resolve(flag).kind == kind, (release, flag)
        assert found.resolve(flag).takes_value
    assert found.resolve("--tensor-parallel-size").aliases == ("-tp",)
    assert found.resolve("--pipeline-parallel-size").aliases == ("-pp",)
    assert found.resolve("--served-model-name").nargs == "+"
    assert found.allow_abbrev  # no release's FlexibleArgumentParser sets allow_abbrev=False


def test_the_mp_multi_node_options_appear_in_0_11_1() -> None:
    # vllm/config/parallel.py: nnodes, node_rank, master_addr, master_port (the mp backend's
    # multi-node launch), registered in vllm/engine/arg_utils.py from 0.11.1 on
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port"):
        assert _first(flag) == "0.11.1", flag
        assert flag not in surface("0.11.0")[0].flags
        assert table()["flags"][flag][-1][1] == len(releases()) - 1  # still there
    newest = surface(releases()[-1])[0]
    assert newest.resolve("-n").name == "--nnodes" and newest.resolve("-r").name == "--node-rank"
    assert newest.resolve("--master-port").kind == "int"


def test_headless_data_parallel_and_api_server_count_exist_from_the_first_release() -> None:
    for flag in ("--headless", "--data-parallel-size", "--data-parallel-size-local",
                 "--data-parallel-start-rank", "--data-parallel-address",
                 "--data-parallel-rpc-port", "--data-parallel-hybrid-lb",
                 "--api-server-count"):
        assert _first(flag) == "0.10.0", flag
    oldest = surface("0.10.0")[0]
    assert oldest.resolve("--headless").kind == "bool"
    assert oldest.resolve("--data-parallel-hybrid-lb").negatable  # BooleanOptionalAction
    assert oldest.resolve("-asc").name == "--api-server-count"
    assert oldest.resolve("-dpl").name == "--data-parallel-size-local"


def test_hybrid_lb_gets_its_short_alias_and_external_lb_appears_in_0_11_1() -> None:
    assert "-dph" not in surface("0.11.0")[0].flags
    assert surface("0.11.1")[0].resolve("-dph").name == "--data-parallel-hybrid-lb"
    assert _first("--data-parallel-external-lb") == "0.11.1"


def test_all2all_backend_replaces_its_environment_variable_in_0_11_1() -> None:
    assert _first("--all2all-backend") == "0.11.1"
    entry = table()["env_to_flag"]["VLLM_ALL2ALL_BACKEND"]
    assert entry == {"flag": "--all2all-backend", "since": "0.11.1"}
    assert surface("0.11.1")[0].env_to_flag["VLLM_ALL2ALL_BACKEND"] == "--all2all-backend"
    assert "VLLM_ALL2ALL_BACKEND" not in surface("0.11.0")[0].env_to_flag
    flag = surface("0.12.0")[0].resolve("--all2all-backend")
    assert flag.choices and "allgather_reducescatter" in flag.choices
    assert flag.value_problem("bogus") is not None
    # the CLI takes "passthrough" out of the Literal (vllm/engine/arg_utils.py, 0.32.0)
    assert "passthrough" not in (surface("0.32.0")[0].resolve("--all2all-backend").choices
                                 or ())


def test_every_env_to_flag_entry_names_an_option_of_its_release() -> None:
    for var, entry in table()["env_to_flag"].items():
        assert var.startswith("VLLM_")
        found = surface(entry["since"])[0]
        assert entry["flag"] in found.flags, var


def test_resolve_on_the_real_table() -> None:
    found = surface("0.12.0")[0]
    assert found.resolve("--tensor-parallel-size").name == "--tensor-parallel-size"
    assert found.resolve("--tensor_parallel_size").name == "--tensor-parallel-size"
    assert found.resolve("--tensor-parallel-s").name == "--tensor-parallel-size"
    assert found.resolve("--no-enforce-eager").name == "--enforce-eager"
    with pytest.raises(AmbiguousOption) as caught:
        found.resolve("--data-parallel-")
    assert "--data-parallel-size" in caught.value.candidates
    assert "--data-parallel-size-local" in caught.value.candidates
    assert list(caught.value.candidates) == sorted(caught.value.candidates)
    with pytest.raises(UnknownOption):
        found.resolve("--no-such-option-at-all")
    with pytest.raises(UnknownOption):
        surface("0.11.0")[0].resolve("--nnodes")  # from 0.11.1 on


def test_an_option_removed_later_is_unknown_after_its_last_release() -> None:
    assert surface("0.11.2")[0].resolve("--num-redundant-experts").kind == "int"
    with pytest.raises(UnknownOption):
        surface("0.12.0")[0].resolve("--num-redundant-experts")


def test_surface_between_newer_and_older_and_unparseable() -> None:
    known = releases()
    between, warning = surface("0.11.1rc2")  # a pre-release counts as its release
    assert between.release == "0.11.1" and warning is None
    between, warning = surface("0.15.2")
    assert between.release == "0.15.1" and warning and "nearest older" in warning
    newest, warning = surface("99.0.0")
    assert newest.release == known[-1] and warning and "stale" in warning
    with pytest.raises(ValueError, match="older than the oldest"):
        surface("0.9.2")
    with pytest.raises(ValueError, match="not a vLLM version"):
        surface("latest")


# --- the generator, on hand-written sources -----------------------------------------------------

CONFIG = '''
from dataclasses import dataclass, field
from typing import Literal, Optional, Union
from vllm.config.kinds import Backend

Mode = Literal["fast", "slow"]


@dataclass
class Inner:
    x: int = 0


@config
class ParallelConfig:
    tensor_parallel_size: int = 1
    backend: Optional[Backend] = None
    mode: Mode = "fast"
    mode_or_text: Union[Mode, str] = "fast"
    ratio: float = 0.9
    eager: bool = False
    sizes: list[int] = field(default_factory=list)
    pair: tuple[int, int] = (1, 2)
    inner: Inner = field(default_factory=Inner)
    extra: dict[str, int] = field(default_factory=dict)
    hf_token: bool | str | None = None
    max_model_len: int | None = None
    secret: "SkipValidation[Mystery]" = None
'''

KINDS = '''
from typing import Literal
Backend = Literal["mp", "ray", Literal["uni"]]
'''

ARG_UTILS = '''
import argparse
from vllm.config.parallel import Mode, ParallelConfig

def _compute_kwargs(cls):
    for field in fields(cls):
        if dataclass_cls is not None:
            pass
        elif type_hints == {bool, str, type(None)}:
            pass
        elif contains_type(type_hints, int):
            if name in {"max_model_len"}:
                pass


class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        parallel_kwargs = get_kwargs(ParallelConfig)
        group = parser.add_argument_group("ParallelConfig")
        group.add_argument("--tensor-parallel-size", "-tp",
                           **parallel_kwargs["tensor_parallel_size"])
        for name in ("backend", "mode", "mode_or_text", "ratio", "eager", "sizes", "pair",
                     "inner", "extra", "hf_token", "max_model_len", "secret"):
            pass
        group.add_argument("--backend", **{**parallel_kwargs["backend"], "default": None})
        group.add_argument("--mode", **parallel_kwargs["mode"])
        group.add_argument("--mode-or-text", **parallel_kwargs["mode_or_text"])
        group.add_argument("--ratio", **parallel_kwargs["ratio"])
        group.add_argument("--eager", **parallel_kwargs["eager"])
        group.add_argument("--sizes", **parallel_kwargs["sizes"])
        group.add_argument("--pair", **parallel_kwargs["pair"])
        group.add_argument("--inner", **parallel_kwargs["inner"])
        group.add_argument("--extra", **parallel_kwargs["extra"])
        group.add_argument("--hf-token", **parallel_kwargs["hf_token"])
        group.add_argument("--max-model-len", **parallel_kwargs["max_model_len"])
        group.add_argument("--secret", **parallel_kwargs["secret"])
        parallel_kwargs["mode"]["choices"].remove(SLOW)
        group.add_argument("--lambda", type=lambda s: [int(p) for p in s.split(",")])
        group.add_argument("--lower", type=lambda s: s.lower().replace("-", "_"))
        group.add_argument("--disable-log-stats", action="store_true")
        group.add_argument("--level", choices=get_args(Mode))
        return parser


class AsyncEngineArgs(EngineArgs):
    @staticmethod
    def add_cli_args(parser, async_args_only=False):
        if not async_args_only:
            parser = EngineArgs.add_cli_args(parser)
        parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction)
        return parser

SLOW = "slow"
'''

CLI_ARGS = '''
import json
from dataclasses import field
from vllm.engine.arg_utils import AsyncEngineArgs


@config
class BaseFrontendArgs:
    api_key: list[str] | None = None
    allowed_origins: list[str] = field(default_factory=list)

    @classmethod
    def _customize_cli_kwargs(cls, frontend_kwargs):
        frontend_kwargs["allowed_origins"]["type"] = json.loads
        del frontend_kwargs["allowed_origins"]["nargs"]
        return frontend_kwargs

    @classmethod
    def add_cli_args(cls, parser):
        frontend_kwargs = get_kwargs(cls)
        frontend_kwargs = cls._customize_cli_kwargs(frontend_kwargs)
        group = parser.add_argument_group(cls.__name__)
        for key, value in frontend_kwargs.items():
            extra_flags = value.pop("flags", [])
            group.add_argument(*extra_flags, f"--{key.replace('_', '-')}", **value)
        return parser


@config
class FrontendArgs(BaseFrontendArgs):
    host: str | None = None
    port: int = 8000

    @classmethod
    def _customize_cli_kwargs(cls, frontend_kwargs):
        frontend_kwargs = super()._customize_cli_kwargs(frontend_kwargs)
        frontend_kwargs["port"]["flags"] = ["-p"]
        return frontend_kwargs


def make_arg_parser(parser):
    parser.add_argument("model_tag", type=str, nargs="?")
    parser.add_argument("--headless", action="store_true", default=False)
    parser.add_argument("--api-server-count", "-asc", type=int, default=None)
    parser.add_argument("--config", help="a YAML file")
    parser = FrontendArgs.add_cli_args(parser)
    parser = AsyncEngineArgs.add_cli_args(parser)
    return parser
'''

SERVE = '''
from vllm.entrypoints.openai.cli_args import make_arg_parser


class ServeSubcommand(CLISubcommand):
    name = "serve"

    def subparser_init(self, subparsers):
        serve_parser = subparsers.add_parser("serve")
        return make_arg_parser(serve_parser)
'''

ARGPARSE_UTILS = '''
from argparse import ArgumentParser, BooleanOptionalAction


class EnableDisableAction(BooleanOptionalAction):
    pass


class FlexibleArgumentParser(ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", BooleanOptionalAction, EnableDisableAction)
'''

ENVS = '''
environment_variables = {
    "VLLM_HOST_IP": lambda: "",
    "VLLM_MODE": lambda: "fast",
}
'''

FILES = {"vllm/config/__init__.py": "", "vllm/config/parallel.py": CONFIG,
         "vllm/config/kinds.py": KINDS, "vllm/engine/arg_utils.py": ARG_UTILS,
         "vllm/entrypoints/openai/cli_args.py": CLI_ARGS,
         "vllm/entrypoints/cli/serve.py": SERVE,
         "vllm/utils/argparse_utils.py": ARGPARSE_UTILS, "vllm/envs.py": ENVS}


@pytest.fixture(scope="module")
def snippet() -> object:
    return gen.read_release("9.9.9", FILES)


def test_the_generator_reads_explicit_arguments_and_the_serve_entry(snippet) -> None:
    flags = snippet.flags
    assert flags["--headless"]["kind"] == "bool" and not flags["--headless"]["takes_value"]
    assert flags["--api-server-count"] == {"aliases": ["-asc"], "takes_value": True,
                                           "kind": "int", "choices": None, "nargs": None,
                                           "negatable": False}
    assert flags["--config"]["kind"] == "str"  # argparse's default type
    assert "model_tag" not in flags  # positional
    assert snippet.allow_abbrev is True
    assert snippet.env_vars == {"VLLM_HOST_IP", "VLLM_MODE"}


def test_the_generator_mirrors_compute_kwargs_type_rules(snippet) -> None:
    flags = snippet.flags
    assert flags["--tensor-parallel-size"]["kind"] == "int"
    assert flags["--tensor-parallel-size"]["aliases"] == ["-tp"]
    # an aliased, nested Literal from another module, Optional: choices + "None"
    assert flags["--backend"]["choices"] == ["mp", "ray", "uni", "None"]
    assert flags["--mode-or-text"]["choices"] is None  # Literal | str: metavar, not choices
    assert flags["--ratio"]["kind"] == "float"
    assert flags["--eager"]["kind"] == "bool" and flags["--eager"]["negatable"]
    assert flags["--sizes"]["nargs"] == "+" and flags["--sizes"]["kind"] == "int"
    assert flags["--pair"]["nargs"] == "2"
    assert flags["--inner"]["kind"] == "json"  # a dataclass
    assert flags["--extra"]["kind"] == "json"  # a dict
    assert flags["--hf-token"]["nargs"] == "?"  # bool | str | None
    assert flags["--max-model-len"]["kind"] == "str"  # human-readable: 1k, auto
    assert flags["--secret"]["kind"] == "str"  # an unresolved name: vLLM's fallback
    assert "--secret" in snippet.unknown


def test_the_generator_follows_later_mutations_and_lambdas(snippet) -> None:
    flags = snippet.flags
    assert flags["--mode"]["choices"] == ["fast"]  # .remove(SLOW), a module constant
    assert flags["--level"]["choices"] == ["fast", "slow"]  # get_args(Mode)
    assert "--lambda" in snippet.unknown and flags["--lambda"]["kind"] == "str"
    assert "--lower" not in snippet.unknown
    assert flags["--disable-log-stats"]["kind"] == "bool"


def test_the_generator_unrolls_frontend_args_fields_and_their_customisation(snippet) -> None:
    flags = snippet.flags
    assert flags["--host"]["kind"] == "str"
    assert flags["--port"]["kind"] == "int" and flags["--port"]["aliases"] == ["-p"]
    assert flags["--api-key"]["nargs"] == "+"
    assert flags["--allowed-origins"]["kind"] == "json"
    assert flags["--allowed-origins"]["nargs"] is None


def test_enable_disable_action_adds_the_inverse_spelling(snippet) -> None:
    flag = snippet.flags["--enable-log-requests"]
    assert flag["negatable"] and flag["aliases"] == ["--disable-log-requests"]


def test_allow_abbrev_false_is_found() -> None:
    files = dict(FILES)
    files["vllm/utils/argparse_utils.py"] = ARGPARSE_UTILS.replace(
        "super().__init__(*args, **kwargs)",
        "kwargs['allow_abbrev'] = False\n        super().__init__(*args, **kwargs)")
    assert gen.read_release("9.9.9", files).allow_abbrev is False


def test_type_hints_flatten_unions_optionals_and_annotated() -> None:
    sources = gen.Sources({"vllm/config/parallel.py": CONFIG, "vllm/config/kinds.py": KINDS})
    hints = gen.type_hints(sources, "vllm.config.parallel",
                           ast.parse("Annotated[Optional[int | Mode], 1]", mode="eval").body)
    assert {h.kind for h in hints} == {"int", "literal", "none"}


def test_spans_env_candidates_and_the_table() -> None:
    assert gen.spans(["a", "a", None, "b", "b", "a"]) == [[0, 1, "a"], [3, 4, "b"],
                                                          [5, 5, "a"]]
    opt = {"aliases": [], "takes_value": True, "kind": "str", "choices": None, "nargs": None,
           "negatable": False}
    reads = [gen.Release("1.0.0", {}, True, {"VLLM_A2A", "VLLM_OTHER", "VLLM_GONE"}, []),
             gen.Release("1.1.0", {"--a2a": opt, "--gone": opt}, True, set(), [])]
    rejected: list[str] = []
    built = gen.build_table(reads, "2026-01-01", rejected)
    assert built["env_to_flag"] == {"VLLM_A2A": {"flag": "--a2a", "since": "1.1.0"},
                                    "VLLM_GONE": {"flag": "--gone", "since": "1.1.0"}}
    assert built["releases"] == ["1.0.0", "1.1.0"]
    assert built["flags"]["--a2a"] == [[1, 1, opt]]
    # an option older than the variable's removal, never named with it: not confirmed
    reads = [gen.Release("1.0.0", {"--a2a": opt}, True, {"VLLM_A2A"}, []),
             gen.Release("1.1.0", {"--a2a": opt}, True, set(), [])]
    rejected = []
    assert gen.build_table(reads, "2026-01-01", rejected)["env_to_flag"] == {}
    assert rejected and "VLLM_A2A" in rejected[0]
    reads[0].env_mentions = {"VLLM_A2A"}
    assert gen.build_table(reads, "2026-01-01")["env_to_flag"]["VLLM_A2A"]["since"] == "1.0.0"
    text = gen.dump(built)
    assert vllm_cli.table(text)["flags"]["--a2a"] == [[1, 1, opt]]


def test_archive_choices_prefers_the_sdist_and_skips_pre_releases() -> None:
    files = [{"filename": f, "url": "https://x/" + f} for f in (
        "vllm-0.9.2.tar.gz", "vllm-0.10.0.tar.gz", "vllm-0.10.0-cp38-abi3-linux.whl",
        "vllm-0.10.1.1.tar.gz", "vllm-0.11.0rc1.tar.gz",
        "vllm-0.15.0-cp38-abi3-manylinux_2_31_aarch64.whl",
        "vllm-0.15.0-cp38-abi3-manylinux_2_31_x86_64.whl",
        "vllm-0.20.1-1-cp38-abi3-linux.whl", "vllm-0.20.1-cp38-abi3-linux.whl")]
    chosen = gen.archive_choices(files)
    assert list(chosen) == ["0.10.0", "0.10.1.1", "0.15.0", "0.20.1"]
    assert chosen["0.10.0"][0] == "vllm-0.10.0.tar.gz"
    assert chosen["0.15.0"][0] == "vllm-0.15.0-cp38-abi3-manylinux_2_31_x86_64.whl"
    assert chosen["0.20.1"][0] == "vllm-0.20.1-cp38-abi3-linux.whl"


def test_read_sources_takes_the_vllm_python_files_of_an_sdist_and_a_wheel(tmp_path) -> None:
    sdist = tmp_path / "vllm-9.9.9.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, text in (("vllm-9.9.9/vllm/envs.py", ENVS), ("vllm-9.9.9/setup.py", "x"),
                           ("vllm-9.9.9/tests/vllm/test_x.py", "y"),
                           ("vllm-9.9.9/vllm/README.md", "z")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    assert gen.read_sources(sdist) == {"vllm/envs.py": ENVS}
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/envs.py", ENVS)
        archive.writestr("vllm-9.9.9.dist-info/METADATA", "m")
    assert gen.read_sources(wheel) == {"vllm/envs.py": ENVS}
