"""The table of every inventory variable vllm-provision reads: type, default, scope, secret, doc.

This table is the single source for inventory validation (``vllm_provision.inventory``), the
defaults of :class:`~vllm_provision.core.models.EngineArgs` and of replica settings, and the
reference
table in ``docs/inventory.md`` (:func:`render_markdown_table`; a unit test keeps the doc current).
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from vllm_provision import backends
from vllm_provision.settings import instance, kinds
from vllm_provision.settings.kinds import check_user_name

Scope = Literal["host", "replica"]

# An environment variable name as POSIX shells and systemd's env-file parser accept it.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# systemd.unit(5): a unit name is [A-Za-z0-9:_.\\-]+ (with an optional @instance) and a type suffix.
UNIT_NAME_RE = re.compile(r"^[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]*)?\.service$")
# useradd(8): a portable user name.
# Names whose values we never print (Ansible's no_log heuristics use the same words).
SECRET_NAME_RE = re.compile(r"(token|password|passwd|_pass$|secret|api_?key|private_?key$|"
                            r"credential)", re.IGNORECASE)
MASK = "********"


def check_ip_address(value: str) -> str | None:
    """Return why ``value`` is not an IPv4/IPv6 address, or None when it is one."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return "an IP address such as 10.0.0.11"
    return None


def check_cidr_list(value: list[str]) -> str | None:
    """Return why an item of ``vllm_api_allow_from`` is not an IP address or CIDR network
    (``ipaddress.ip_network`` with ``strict=True``: no host bits set), or None."""
    for item in value:
        try:
            ipaddress.ip_network(str(item), strict=True)
        except ValueError:
            return ("IP addresses or CIDR networks such as 10.0.0.0/8 or fd00::/8, without host "
                    f"bits (bad item {item!r})")
    return None


def check_ssh_word(value: str) -> str | None:
    """Return why ``value`` cannot be an ssh host or user name, or None.

    A leading ``-`` would be read by ssh as an option (``-oProxyCommand=...``: CVE-2017-1000117
    class of injection); whitespace would split the word.
    """
    if not value or value.startswith("-") or any(c.isspace() for c in value):
        return "a name or address without spaces that does not start with '-'"
    return None


def check_env_mapping_names(value: Mapping[str, Any]) -> str | None:
    """Return why a key of ``vllm_env`` is not a valid environment variable name, or None."""
    for key in value:
        if not ENV_NAME_RE.match(str(key)):
            return f"environment variable names matching {ENV_NAME_RE.pattern} (bad name {key!r})"
    return None


def check_unit_name(value: str) -> str | None:
    """Return why ``value`` is not a ``.service`` unit name per systemd.unit(5), or None."""
    return None if UNIT_NAME_RE.match(value) else "a unit name such as vllm.service"


def check_absolute_path(value: str) -> str | None:
    """Return why ``value`` is not an absolute path, or None."""
    return None if value.startswith("/") else "an absolute path such as /opt/vllm"


def check_owned_dirs_list(value: list[str]) -> str | None:
    """Return why an item of ``provision_owned_dirs`` is not an absolute, normalised path that
    is not a system directory (:mod:`vllm_provision.settings.kinds`), or None."""
    for item in value:
        wrong = kinds.check_path(item)
        if wrong is None and kinds.is_system_dir(item):
            wrong = f"a directory that is not a system directory (got {item!r})"
        if wrong is not None:
            return wrong
    return None


def check_gpu_indexes(value: list[int]) -> str | None:
    """Return why ``value`` cannot be ``vllm_gpus``, or None: a non-empty list of distinct
    GPU indexes >= 0 (nvidia-smi's ``index``; CUDA_VISIBLE_DEVICES names each device once,
    and an index below 0 names none). The items are already integers
    (``Variable.items``); whether the host has them is preflight's ``host.gpus``."""
    if not value:
        return "at least one GPU index, such as [2, 3] (remove vllm_gpus to use GPUs 0..N-1)"
    for item in value:
        if item < 0:
            return f"GPU indexes >= 0, nvidia-smi's index column (bad item {item})"
    repeated = sorted({item for item in value if value.count(item) > 1})
    if repeated:
        return ("distinct GPU indexes (listed more than once: "
                + ", ".join(map(str, repeated)) + ")")
    return None


# The shortest secret accepted: a shorter one is easy to guess, and the masker, which replaces
# every occurrence of a secret in the output, would also hide ordinary words that equal it.
MIN_SECRET_LENGTH = 8


def check_fraction(value: float) -> str | None:
    """Return why ``value`` is not a fraction in (0, 1], or None (vLLM's CacheConfig:
    ``gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)``, vllm/config/cache.py)."""
    return None if 0 < value <= 1 else "a number greater than 0 and at most 1, such as 0.9"


def check_alert_seconds(value: float) -> str | None:
    """Return why ``value`` cannot be an alert threshold in seconds (a number > 0), or None: a
    latency quantile of a vLLM histogram is never below 0, so 0 or less would fire always."""
    return None if value > 0 else "a number of seconds greater than 0, such as 2.5"


READY_POLL_S = 1.0
"""Seconds between two polls of the readiness wait (module ``vllm_wait_ready``'s ``poll_s``
default): the stall rule cannot judge progress in less (docs/deploy.md, "A start that
stalls")."""


def check_stall_timeout(value: float) -> str | None:
    """Return why ``value`` cannot be ``vllm_stall_timeout_s``, or None: seconds > 0 and at
    least the readiness wait's poll interval (:data:`READY_POLL_S`); 0 or less would end every
    start at its first poll, and less than one poll cannot see a progress line arrive."""
    if value <= 0 or value < READY_POLL_S:
        return (f"a number of seconds of at least {READY_POLL_S:g} (the readiness wait polls "
                f"every {READY_POLL_S:g} s), such as 300; a large model on slow storage needs "
                "more")
    return None


# The phases of a start that keep a budget (vllm_provision/output/phases.py labels; a unit test
# keeps this list within them): vLLM's wait for a Ray placement group has its own bound
# (vllm_gpu_wait_timeout_s), so it takes none.
BUDGET_PHASES = ("loading weights", "weights loaded", "profiling memory", "sizing the KV cache",
                 "compiling", "capturing CUDA graphs", "engine ready", "API server up")


def check_phase_budgets(value: dict[str, Any]) -> str | None:
    """Return why ``value`` cannot be ``vllm_phase_budgets_s``, or None: a mapping from phase
    labels of :data:`BUDGET_PHASES` to seconds > 0."""
    for key, seconds in value.items():
        if key not in BUDGET_PHASES:
            return ("a mapping from phase names to seconds; phase names: "
                    + ", ".join(BUDGET_PHASES) + f" (not {key!r})")
        try:
            number = float(seconds)  # a dict variable's values arrive as strings
        except (TypeError, ValueError):
            number = 0.0
        if isinstance(seconds, bool) or not number > 0 or number == float("inf"):
            return f"seconds > 0 for each phase ({key!r}: {seconds!r})"
    return None


def check_load_rate(value: float) -> str | None:
    """Return why ``value`` cannot be ``vllm_load_rate_mib_s``, or None: MiB/s > 0."""
    return None if value > 0 else "a read rate in MiB/s above 0, such as 200"


def check_secret(value: str) -> str | None:
    """Return why ``value`` cannot be a secret (shorter than MIN_SECRET_LENGTH), or None."""
    if len(value) < MIN_SECRET_LENGTH:
        return (f"a secret of at least {MIN_SECRET_LENGTH} characters (a shorter one is easy "
                "to guess; e.g. generate one with: openssl rand -hex 16)")
    return None


@dataclass(frozen=True)
class Variable:
    """One inventory variable we read.

    Attributes:
        name: the variable name as written in the inventory (``vllm_api_port``).
        type: the Python type of a valid value: ``str``, ``int``, ``float``, ``bool``, ``list``
            (of scalars, rendered as strings) or ``dict`` (string keys to scalar values).
        default: the value when unset; ``None`` means "unset" (or required when ``required``).
        doc: one line for the reference table.
        example: a value as it would be written in YAML.
        scope: ``replica``: must be equal on every node of a replica (one source, nodes cannot
            disagree); ``host``: may differ per host.
        secret: the value is never printed (masked as ``********``).
        required: a replica cannot be built without it.
        choices: allowed values for a ``str`` variable (``vllm_backend``: the registered
            backends, read when checked).
        minimum: smallest allowed ``int`` (ports: 1; sizes and counts: 1; ranks: 0).
        maximum: largest allowed ``int`` (ports: 65535).
        check: extra rule on a value of the right type; returns what is expected, or None if fine.
        engine_field: the :class:`~vllm_provision.core.models.EngineArgs` field it fills, if any.
        items: the type of a ``list``'s items: ``str`` (numbers written in YAML become text)
            or ``int`` (integers only, kept as ``int``: ``vllm_gpus``).
    """

    name: str
    type: type
    default: Any
    doc: str
    example: str
    scope: Scope = "replica"
    secret: bool = False
    required: bool = False
    choices: Sequence[str] = ()
    minimum: int | None = None
    maximum: int | None = None
    check: Callable[[Any], str | None] | None = None
    engine_field: str | None = None
    items: type = str

    def expected(self) -> str:
        """Describe a valid value in words (``"an integer 1-65535"``)."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.type is bool:
            return "true or false"
        if self.type is int:
            if self.minimum is not None and self.maximum is not None:
                return f"an integer {self.minimum}-{self.maximum}"
            if self.minimum is not None:
                return f"an integer >= {self.minimum}"
            return "an integer"
        if self.type is float:
            return "a number"
        if self.type is list:
            return "a list of integers" if self.items is int else "a list of strings"
        if self.type is dict:
            return "a mapping of names to strings"
        return "a string"


MAX_PORT = 65535
"""The largest TCP port (ports are 16-bit numbers, RFC 9293 section 3.1)."""


def _port(name: str, default: int | None, doc: str, example: str | None = None, *,
          minimum: int = 1, **more: Any) -> Variable:
    """A row of the table for a TCP port variable: an ``int`` from ``minimum`` (1 unless the
    program that binds it allows less of the range, as Ray's worker ports) to :data:`MAX_PORT`;
    ``example`` is the default as written in YAML unless given (a port without a default).
    ``more``: the other fields of :class:`Variable` (``scope``, ``engine_field``)."""
    return Variable(name, int, default, doc, str(default) if example is None else example,
                    minimum=minimum, maximum=MAX_PORT, **more)


_TABLE: tuple[Variable, ...] = (
    # Ansible connection variables (docs.ansible.com, "Connecting to hosts: behavioral inventory
    # parameters").
    Variable("ansible_host", str, None, "Address to connect to over SSH (default: the inventory "
             "name); also the default of `vllm_host_ip`.", "10.0.0.11", scope="host",
             check=check_ssh_word),
    _port("ansible_port", 22, "SSH port.", scope="host"),
    Variable("ansible_user", str, None, "SSH user (default: ~/.ssh/config or the local user).",
             "deploy", scope="host", check=check_ssh_word),
    Variable("ansible_ssh_private_key_file", str, None, "SSH private key; `~` expanded, relative "
             "paths are relative to the inventory file's folder.", "~/.ssh/id_ed25519",
             scope="host"),
    Variable("ansible_ssh_common_args", str, None, "Extra ssh options; only "
             "`-o UserKnownHostsFile=...` is read (added to the known_hosts files).",
             "-o UserKnownHostsFile=/etc/vp/known_hosts", scope="host"),
    Variable("ansible_ssh_extra_args", str, None, "Same as `ansible_ssh_common_args`.",
             "-o UserKnownHostsFile=/etc/vp/known_hosts", scope="host"),
    Variable("ansible_become", bool, False, "Run privileged commands through sudo.", "true",
             scope="host"),
    Variable("ansible_become_user", str, "root", "The sudo target user.", "root", scope="host",
             check=check_ssh_word),
    Variable("provision_owned_dirs", list, [], "Directories outside the tool's own prefixes "
             "(`/var/lib/vllm*`, `/etc/vllm*`, `/opt/vllm*`, ...) that state, cache, temp and "
             "config directories may be placed in; never a system directory such as `/tmp` "
             "(docs/security.md).", "[/data/llm]", check=check_owned_dirs_list),
    Variable("provision_known_hosts_file", str, None, "One more known_hosts file to trust "
             "(`~` expanded, relative to the inventory file's folder).",
             "/var/lib/vllm-provision/lab/known_hosts", scope="host"),
    # The replica and its nodes.
    Variable("vllm_replica_id", str, None, "The replica's owner id in the hosts' state records: "
             "a run owns a host whose record holds the same id (docs/deploy.md, \"Who owns a "
             "host\"). Unset: derived from the replica's name, its hosts' names and cluster "
             "addresses in node-rank order, and `vllm_model`, so a copy of the inventory at "
             "another path is the same owner. Set it to keep the ownership across a change of "
             "those; unique among the inventory's replicas. 1-63 characters A-Za-z0-9 . _ -, "
             "starting with a letter or digit.", "llm-prod", check=kinds.check_replica_id),
    Variable("vllm_instance", str, None, "This replica's name on servers it shares with other "
             "replicas: its units, config files, firewall table, state record and run lock there "
             "take it as a suffix (`vllm-a.service`), so replicas on disjoint `vllm_gpus` of one "
             "server never touch each other's (docs/inventory.md, \"Shared servers\"). Set on "
             "every replica with a node on a shared server; unset: today's names.", "a",
             check=instance.check_instance),
    Variable("vllm_backend", str, None, "Executor backend: vLLM multi-node multiprocessing "
             "(`mp`) or a Ray cluster (`ray`). Unset: vLLM's own default rule picks it (`mp`; "
             "see \"Backend default\").", "mp", choices=backends.Names()),
    Variable("vllm_node_rank", int, None, "This node's rank in its replica, 0..N-1; 0 is the "
             "master (mp) or Ray head. May be omitted on a single-host replica.", "0",
             scope="host", minimum=0),
    Variable("vllm_host_ip", str, None, "This node's IP on the cluster network (VLLM_HOST_IP, "
             "Ray --node-ip-address); default `ansible_host`, which must then be an IP.",
             "10.0.0.11", scope="host", check=check_ip_address),
    Variable("vllm_command_output_limit_mib", int, 64, "MiB of output (stdout and stderr) one "
             "remote command may send back; past it the command fails naming the host and "
             "nothing more is read (docs/security.md, \"Bounded input\").", "64", scope="host",
             minimum=1, maximum=4096),
    Variable("vllm_cluster_interface", str, None, "Network interface of the cluster network "
             "(NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME).", "eth0", scope="host"),
    # Engine arguments (vllm serve).
    Variable("vllm_model", str, None, "Model path (`vllm serve MODEL`), the same absolute path "
             "on every node. The env files set `HF_HUB_OFFLINE=1` (never download at start), so "
             "a Hugging Face id is served only from the cache; to download, set "
             "`HF_HUB_OFFLINE: '0'` in `vllm_env` (and `vllm_hf_token` for a gated model).",
             "/srv/models/llama", required=True, engine_field="model"),
    Variable("vllm_served_model_name", str, None, "Name served by the API "
             "(`--served-model-name`).", "llama", engine_field="served_model_name"),
    Variable("vllm_tensor_parallel_size", int, 1, "`--tensor-parallel-size` (GPUs per pipeline "
             "stage).", "4", engine_field="tensor_parallel_size", minimum=1),
    Variable("vllm_pipeline_parallel_size", int, 1, "`--pipeline-parallel-size` (pipeline "
             "stages).", "2", engine_field="pipeline_parallel_size", minimum=1),
    Variable("vllm_data_parallel_size", int, 1, "Data-parallel engines of the replica "
             "(`--data-parallel-size`), each of TP x PP GPUs on one node; more than 1 makes a "
             "data-parallel replica (mp backend; docs/serving.md).", "4",
             engine_field="data_parallel_size", minimum=1),
    Variable("vllm_data_parallel_size_local", int, None, "Data-parallel engines on each node "
             "(`--data-parallel-size-local`); default: the size over the node count, which must "
             "then divide it. Size = local size x nodes.", "2",
             engine_field="data_parallel_size_local", minimum=1),
    Variable("vllm_data_parallel_layout", str, "internal", "How a data-parallel replica "
             "serves: `internal`, one API server on rank 0 spreading requests over every "
             "engine, the other nodes `--headless`; `hybrid`, an API server on every node for "
             "its own engines (`--data-parallel-hybrid-lb`), each a worker of the front door "
             "(vLLM docs, \"Data Parallel Deployment\"; docs/serving.md).", "hybrid",
             choices=("internal", "hybrid"), engine_field="data_parallel_layout"),
    _port("vllm_data_parallel_rpc_port", 29550, "Data parallel: rank 0's handshake port for "
          "the other nodes' engines (`--data-parallel-rpc-port`; vLLM's default 29550).",
          engine_field="data_parallel_rpc_port"),
    Variable("vllm_max_model_len", int, None, "`--max-model-len`, in tokens.", "8192",
             engine_field="max_model_len", minimum=1),
    Variable("vllm_gpu_memory_utilization", float, 0.9, "`--gpu-memory-utilization`: the "
             "fraction of each GPU's total memory vLLM may use for weights, activations and the "
             "KV cache (vLLM's default 0.9); preflight's memory estimate checks the model "
             "against it (docs/preflight.md, \"Will the model fit\").", "0.9",
             engine_field="gpu_memory_utilization", check=check_fraction),
    Variable("vllm_api_host", str, "0.0.0.0", "Address the master's HTTP server binds "
             "(`--host`; every node's with the hybrid data-parallel layout, which needs 0.0.0.0 "
             "or ::).", "0.0.0.0", engine_field="api_host", check=check_ip_address),
    Variable("vllm_api_via", str, "auto", "How the controller reaches rank 0's API (readiness, "
             "verify, status, bench, fault, upgrade). `direct`: HTTP to the API address. `ssh`: "
             "each HTTP connection is a forwarded channel of the SSH connection to rank 0 (no "
             "process, no port on the controller; through ProxyJump too). `auto`: preflight tries "
             "the address once; reachable (even refused) is `direct`, a timeout or no route is "
             "`ssh`, and an API bound to loopback is `ssh` (docs/deploy.md, \"How the controller "
             "reaches the API\").", "ssh", choices=("auto", "direct", "ssh")),
    _port("vllm_api_port", 8000, "HTTP port of the master (`--port`; of every node with the "
          "hybrid data-parallel layout).", engine_field="api_port"),
    _port("vllm_master_port", 29501, "mp: TCP store port on rank 0 (`--master-port`).",
          engine_field="master_port"),
    Variable("vllm_extra_args", list, [], "More `vllm serve` arguments, one list item per word. "
             "Not: --nnodes, --node-rank, --headless, --distributed-executor-backend, the "
             "data-parallel options, nor options that have a variable here.",
             "[--max-num-seqs, '64']", engine_field="extra_args"),
    Variable("vllm_api_key", str, None, "API key clients must send (`VLLM_API_KEY` in the 0600 "
             "env file, never in the unit or output); at least 8 characters.",
             "s3cr3t-k3y-0f-32-chars", secret=True, check=check_secret,
             engine_field="api_key"),
    Variable("vllm_hf_token", str, None, "Hugging Face token (`HF_TOKEN` in the 0600 env "
             "files, never in a unit or output), for a model id that must be downloaded: "
             "set `HF_HUB_OFFLINE: '0'` in `vllm_env` too; at least 8 characters.",
             "hf_0123456789abcdef", secret=True, check=check_secret),
    Variable("vllm_env", dict, {}, "More environment for the vLLM unit (env file); values "
             "whose name contains token/password/secret/key are masked.",
             "{HF_HUB_OFFLINE: '1'}", check=check_env_mapping_names),
    Variable("vllm_node_env", dict, {}, "More environment for this node's units only, added "
             "after `vllm_env` (wins over it): settings that must differ per node, such as the "
             "CPU build's `VLLM_CPU_OMP_THREADS_BIND`.", "{VLLM_CPU_OMP_THREADS_BIND: '0'}",
             scope="host", check=check_env_mapping_names),
    Variable("vllm_device", str, "cuda", "The accelerator the replica runs on: `cuda` (NVIDIA "
             "GPUs, checked with nvidia-smi) or `cpu` (vLLM's CPU build: preflight counts CPU "
             "cores as the node's devices and does not ask for GPUs).", "cpu",
             choices=("cuda", "cpu")),
    Variable("vllm_gpus", list, None, "The GPUs this node's vLLM and Ray processes may use, "
             "as nvidia-smi's `index` numbers: rendered as `CUDA_VISIBLE_DEVICES` into the "
             "node's env files (vLLM's, and Ray's, whose `--num-gpus` is then their count), and "
             "the only GPUs preflight and the shared pool's gang start look at. At least the "
             "node's GPU workers (TP x PP over the nodes, times the engines per node with data "
             "parallel); more are allowed: CUDA numbers the listed GPUs in this order and vLLM's "
             "mp workers take the first ones, Ray may hand out any. Unset: GPUs 0..N-1 and no "
             "`CUDA_VISIBLE_DEVICES` (docs/inventory.md, \"GPU sets\").", "[2, 3]",
             scope="host", items=int, check=check_gpu_indexes),
    # Service settings.
    Variable("vllm_venv", str, "/opt/vllm", "Python virtual environment holding vLLM.",
             "/opt/vllm", check=check_absolute_path),
    Variable("vllm_stack_lock", str, None, "The replica's Python stack lock (`provision stack "
             "lock` writes it, `provision stack sync` installs it; relative to the inventory "
             "file's folder). Set: preflight and drift compare every node with it "
             "(docs/stack.md).", "stack.lock.txt"),
    Variable("vllm_service_user", str, "vllm", "System user the units run as.", "vllm",
             check=check_user_name),
    Variable("vllm_unit_name", str, "vllm.service", "systemd unit of the vLLM process.",
             "vllm.service", check=check_unit_name),
    Variable("vllm_ready_timeout_s", int, 1800, "Seconds to wait for the replica to serve.",
             "1800", minimum=1),
    Variable("vllm_stall_timeout_s", float, 300, "Seconds the readiness wait lets a start go "
             "without progress: no node of the replica announced a new phase or new progress "
             "in vLLM's log (loading weights, KV cache, CUDA graphs...). Then the wait ends at "
             "once, naming the node furthest behind, its phase, its last journal lines and the "
             "remedy for that phase, and stops the replica in order (docs/deploy.md, \"A start "
             "that stalls\"). At least the wait's poll interval (1 s).", "600",
             check=check_stall_timeout),
    Variable("vllm_load_rate_mib_s", float, 200, "Read rate of the model's storage the weights "
             "phase's budget assumes, in MiB/s: the budget is twice the weights' size at this "
             "rate, at least 60 s. A phase over its budget is a warning during `up` (the stall "
             "timeout still ends a start that stops moving; docs/deploy.md, \"Phase budgets\").",
             "500", check=check_load_rate),
    Variable("vllm_phase_budgets_s", dict, None, "Seconds each phase of a start may take before "
             "`up` warns, by phase name (loading weights, weights loaded, profiling memory, "
             "sizing the KV cache, compiling, capturing CUDA graphs, engine ready, API server "
             "up); unset phases keep their defaults (docs/deploy.md, \"Phase budgets\").",
             "{compiling: 1200}", check=check_phase_budgets),
    Variable("vllm_gpu_pool", str, "dedicated", "Whether other jobs share the nodes' GPUs. "
             "`dedicated`: a process outside this replica's units on a used GPU is a preflight "
             "error. `shared`: it is a warning, and `up` waits (up to `vllm_gpu_wait_timeout_s`) "
             "until every node's GPUs are free at once before starting any node (mp), re-checking "
             "before each node (docs/preflight.md, \"Shared GPU pool\"). `provision record` "
             "reads it too (docs/evidence.md).", "shared",
             choices=("dedicated", "shared")),
    Variable("vllm_gpu_wait_timeout_s", int, 600, "Seconds `up` waits for GPUs held by other "
             "jobs: a shared pool's gang start (mp), or a Ray placement group pending for want "
             "of free resources (NO_RESOURCES).", "600", minimum=0),
    # Ray.
    _port("ray_port", 6379, "Ray head GCS port."),
    # Every other port Ray listens on, pinned so a firewall can name it (`ray start` options,
    # ray python/ray/scripts/scripts.py; docs/security.md, "Network exposure").
    _port("ray_node_manager_port", 6380, "Raylet port on every node "
          "(`--node-manager-port`; Ray's default 0 picks a random one)."),
    _port("ray_object_manager_port", 6381, "Object manager port on every node "
          "(`--object-manager-port`; Ray's default picks a random one)."),
    _port("ray_client_server_port", None, "Ray client server port on the head "
          "(`--ray-client-server-port`, which Ray accepts only with `ray[client]` "
          "installed). Unset: Ray's own choice, 10001 when `ray[client]` is installed, else "
          "no client server; the firewall and the port checks count 10001.", "10001"),
    _port("ray_min_worker_port", 10002, "Lowest port a Ray worker process binds "
          "(`--min-worker-port`); with `ray_max_worker_port` a range of its own (Ray: "
          "1024-65535, min < max).", minimum=1024),
    _port("ray_max_worker_port", 10999, "Highest port a Ray worker process binds "
          "(`--max-worker-port`; Ray's default is 19999).", minimum=1024),
    _port("ray_dashboard_agent_listen_port", 52365, "HTTP port of the dashboard agent "
          "on every node (`--dashboard-agent-listen-port`)."),
    _port("ray_dashboard_agent_grpc_port", 52366, "gRPC port of the dashboard agent "
          "on every node (`--dashboard-agent-grpc-port`; Ray's default is random)."),
    _port("ray_runtime_env_agent_port", 52367, "Port of the runtime-env agent on every "
          "node (`--runtime-env-agent-port`; Ray's default is random)."),
    _port("ray_metrics_export_port", 52368, "Prometheus metrics port on every node "
          "(`--metrics-export-port`; Ray's default is random)."),
    Variable("ray_include_dashboard", bool, False, "Start Ray's dashboard and its job API on "
             "the head (`--include-dashboard`), bound to the head's `vllm_host_ip`; off: no "
             "dashboard, no job submission (docs/security.md).", "true"),
    _port("ray_dashboard_port", 8265, "Dashboard and job API port on the head "
          "(`--dashboard-port`), when `ray_include_dashboard` is true."),
    Variable("vllm_ray_auth", str, "token", "Ray token authentication (Ray >= 2.52): "
             "`token`: one token per replica, made on the controller, installed 0600 on every "
             "node and named by `RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN_PATH` in the Ray and "
             "vLLM env files (`provision restart --rotate-ray-token` replaces it); `none`: "
             "`RAY_AUTH_MODE=disabled` (docs/security.md).", "none", choices=("token", "none")),
    Variable("ray_env", dict, {}, "More environment for the Ray units only (the Ray env file "
             "on every node, after `vllm_env`), such as the GCS's `RAY_health_check_*` settings, "
             "which also set how long a worker's watchdog waits for an unreachable GCS "
             "(docs/recovery.md).", "{RAY_health_check_period_ms: '3000'}",
             check=check_env_mapping_names),
    Variable("ray_num_gpus", int, None, "GPUs this node declares to Ray (default: GPUs found "
             "by facts).", "4", scope="host", minimum=0),
    Variable("ray_num_cpus", int, None, "CPUs this node declares to Ray.", "32", scope="host",
             minimum=0),
    Variable("ray_memory_bytes", int, None, "Ray `--memory`, in bytes.", "68719476736",
             scope="host", minimum=1),
    Variable("ray_object_store_memory_bytes", int, None, "Ray `--object-store-memory`, in "
             "bytes.", "17179869184", scope="host", minimum=1),
    # Firewall (docs/security.md, "Network exposure").
    Variable("vllm_firewall", str, "off", "`nftables`: install an nftables table of ours "
             "(`inet vllm_provision`) that accepts the replica's inter-node ports only from its "
             "own nodes and the API port only from them and `vllm_api_allow_from`; `off`: none.",
             "nftables", choices=("off", "nftables")),
    Variable("vllm_api_allow_from", list, [], "With `vllm_firewall: nftables`: addresses or "
             "CIDR networks that may reach the API port besides the replica's nodes; empty: "
             "any source.",
             "[10.0.0.0/8, 'fd00::/8']", check=check_cidr_list),
    # Monitoring (docs/monitoring.md, "Exporters on the nodes").
    Variable("vllm_monitoring", str, "off", "`node_exporter`: install and start the "
             "distribution's Prometheus node exporter on every node (its systemd collector on), "
             "on `vllm_node_exporter_port`; `off`: leave the nodes' exporters as they are.",
             "node_exporter", choices=("off", "node_exporter")),
    _port("vllm_node_exporter_port", 9100, "Port of the node exporter, with "
          "`vllm_monitoring: node_exporter` (the node exporter's own default)."),
    Variable("vllm_gpu_exporter", str, "none", "A GPU exporter already running on every node, "
             "for the scrape targets and the firewall: `dcgm-exporter`, `nvidia_gpu_exporter` "
             "or `none`.", "dcgm-exporter",
             choices=("none", "dcgm-exporter", "nvidia_gpu_exporter")),
    _port("vllm_gpu_exporter_port", None, "Port of the GPU exporter (default: the exporter's "
          "own: 9400 for dcgm-exporter, 9835 for nvidia_gpu_exporter).", "9400"),
    Variable("vllm_metrics_allow_from", list, [], "With `vllm_firewall: nftables`: addresses "
             "or CIDR networks of the Prometheus servers that may reach the metrics ports (the "
             "API port's `/metrics`, the exporters, Ray's metrics port) besides the replica's "
             "nodes; empty: the exporters from any source, the rest as without it.",
             "[10.0.5.10]", check=check_cidr_list),
    # (docs/monitoring.md, "Rules")
    Variable("vllm_alert_ttft_p99_s", float, 10.0, "`provision monitor`'s alert rules: the "
             "replica's `VllmTtftP99High` alert fires when its time-to-first-token p99 over "
             "5 minutes stays above this many seconds for 10 minutes.", "2.5",
             check=check_alert_seconds),
    # 2 minutes: one or two missed scrapes at 15 s are a blip, not an outage.
    Variable("vllm_alert_down_for_s", int, 120, "`provision monitor`'s alert rules: how "
             "many seconds rank 0's `/metrics`, a node's exporter or a front door may go "
             "unscraped before `VllmReplicaNotServing`, `VllmNodeUnreachable` or "
             "`VllmFrontDoorDown` fires (the alerts' `for:`).", "300", minimum=1,
             maximum=86400),
    # The front door (group vllm_gateways, role vllm_gateway, docs/front-door.md): vllm-router
    # 0.1.17's flags (vllm_router/router_args.py of its wheel). Host scope: a gateway host may
    # also be a node of a replica, whose other nodes are no gateway.
    _port("vllm_gateway_port", 30000, "Port the front door (`vllm-router --port`) listens on, "
          "on every host of `vllm_gateways`; clients send their OpenAI requests here "
          "(the router's own default).", scope="host"),
    Variable("vllm_gateway_host", str, "0.0.0.0", "Address the front door binds "
             "(`vllm-router --host`; the router's own default, 127.0.0.1, would serve this "
             "host only).", "10.0.0.5", scope="host", check=check_ip_address),
    _port("vllm_gateway_metrics_port", 29000, "Port of the front door's Prometheus metrics "
          "(`vllm-router --prometheus-port`; the router's own default).", scope="host"),
    Variable("vllm_gateway_policy", str, "power_of_two", "How the front door picks a replica "
             "(`vllm-router --policy`): `power_of_two` sends to the less loaded of two replicas "
             "by requests in flight, which suits streams that last minutes (unset with one "
             "replica: `round_robin`, as the router refuses `power_of_two` with one worker); "
             "`round_robin` and "
             "`random` ignore load; `cache_aware` (the router's own default) prefers the replica "
             "that saw the prompt's prefix.", "round_robin", scope="host",
             choices=("power_of_two", "round_robin", "random", "cache_aware",
                      "consistent_hash", "sticky_least_loaded")),
    Variable("vllm_gateway_health_check_interval_s", int, 2, "Seconds between the front "
             "door's `/health` checks of each replica (`--health-check-interval-secs`; the "
             "router's own 60 would send to a dead replica for minutes).", "5", scope="host",
             minimum=1, maximum=3600),
    Variable("vllm_gateway_health_check_timeout_s", int, 5, "Seconds one `/health` check may "
             "take (`--health-check-timeout-secs`).", "5", scope="host", minimum=1,
             maximum=600),
    Variable("vllm_gateway_health_failure_threshold", int, 2, "Failed checks in a row before "
             "the front door stops sending to a replica (`--health-failure-threshold`); one "
             "passing check takes it back (`--health-success-threshold 1`).", "3",
             scope="host", minimum=1, maximum=100),
    Variable("vllm_gateway_request_timeout_s", int, 3600, "Seconds one request may take "
             "through the front door, a whole stream included (`--request-timeout-secs`; the "
             "router's own is 1800).", "7200", scope="host", minimum=1, maximum=7 * 86400),
    Variable("vllm_gateway_venv", str, "/opt/vllm-router", "Where the front door's venv is "
             "on the gateway host: a link to the venv built from the wheelhouse "
             "(`<venv>.<id>`), switched atomically.", "/opt/vllm-router", scope="host",
             check=check_absolute_path),
    Variable("vllm_gateway_wheelhouse", str, None, "Folder on the controller (relative to the "
             "inventory file's folder) holding vllm-router 0.1.17 and its dependencies as "
             "wheels for the gateway hosts' platform and Python; `up` sends them and installs "
             "them with no index (docs/front-door.md, \"Wheels\"). Required with "
             "`vllm_gateways`.", "wheels/gateway", scope="host"),
    # Version pins, checked by preflight on every node.
    Variable("vllm_version", str, None, "Pinned vLLM version.", "0.12.0"),
    Variable("torch_version", str, None, "Pinned torch version (with CUDA build).",
             "2.9.0+cu129"),
    Variable("nccl_version", str, None, "Pinned NCCL version.", "2.27.5"),
    Variable("ray_version", str, None, "Pinned Ray version.", "2.51.1"),
)

VARIABLES: Mapping[str, Variable] = {v.name: v for v in _TABLE}

# Prefixes we own: a variable with one of them that is not in the table is a typo.
OWNED_PREFIXES = ("vllm_", "ray_", "provision_")


@functools.cache
def role_defaults() -> Mapping[str, Any]:
    """Every variable defined in ``roles/*/defaults/main.yml`` (name -> default value).

    These are the operator's knobs (unit names, RestartSec, timeouts, watchdog settings): an
    inventory may override them like any Ansible role default, so the loader accepts their names
    although they are not in :data:`VARIABLES`. The files are the installed package's roles
    (:func:`vllm_provision.resources.role_defaults_files`).

    Raises:
        ProvisionError: the roles are missing from the installation, or a defaults file cannot
            be read or is not a YAML mapping (naming the file): never an empty default.
    """
    import yaml

    from vllm_provision import resources
    from vllm_provision.core.errors import ProvisionError

    merged: dict[str, Any] = {}
    for path in resources.role_defaults_files():
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ProvisionError.single(str(path), "cannot read the role defaults",
                                        actual=str(exc), fix=resources.FIX) from None
        if not isinstance(data, dict):
            raise ProvisionError.single(str(path), "role defaults are not a YAML mapping",
                                        actual=type(data).__name__, fix=resources.FIX)
        merged.update({k: v for k, v in data.items() if isinstance(k, str)})
    return merged


def is_owned(name: str) -> bool:
    """True when ``name`` uses a prefix we own (``vllm_``, ``ray_``, ``provision_``)."""
    return name.startswith(OWNED_PREFIXES)


def suggest(name: str, candidates: Iterable[str]) -> str | None:
    """Return the closest of ``candidates`` to ``name`` (difflib, cutoff 0.6), or None."""
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def is_secret_name(name: str) -> bool:
    """True when values named ``name`` must never be printed.

    Secret variables of the table, plus any name containing token/password/secret/api key/
    credential (``HF_TOKEN`` in ``vllm_env``), or ending in ``_pass`` (``ansible_ssh_pass``,
    ``ansible_become_pass``). ``ansible_ssh_private_key_file`` is a path, not a
    secret.
    """
    known = VARIABLES.get(name)
    if known is not None:
        return known.secret
    return bool(SECRET_NAME_RE.search(name))


def mask(name: str, value: Any) -> Any:
    """Return ``value`` with secrets replaced by ``********``: the value itself if ``name`` is a
    secret name, and the values of secret-named keys inside a mapping (``vllm_env``)."""
    if is_secret_name(name):
        return MASK
    if isinstance(value, Mapping):
        return {k: (MASK if is_secret_name(str(k)) else v) for k, v in value.items()}
    return value


def defaults(scope: Scope | None = None) -> dict[str, Any]:
    """Return ``{name: default}`` for every variable with a default (``None`` defaults left out).

    Args:
        scope: only variables of this scope; ``None`` for all.
    """
    return {
        v.name: (list(v.default) if isinstance(v.default, list) else
                 dict(v.default) if isinstance(v.default, dict) else v.default)
        for v in _TABLE
        if v.default is not None and (scope is None or v.scope == scope)
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown_table() -> str:
    """Return the reference table of every variable as GitHub-flavoured markdown.

    One row per variable: name, type, default, scope, secret, description, example. The text is
    pasted verbatim into ``docs/inventory.md`` between ``<!-- variables:begin -->`` and
    ``<!-- variables:end -->``; a unit test compares the two.
    """
    type_names = {str: "string", int: "integer", float: "number", bool: "boolean",
                  list: "list of strings", dict: "mapping"}
    lines = [
        "| variable | type | default | scope | description | example |",
        "|---|---|---|---|---|---|",
    ]
    for v in _TABLE:
        if v.required:
            default = "**required**"
        elif v.default is None or v.default == [] or v.default == {}:
            default = "unset" if v.default is None else f"`{v.default!r}`"
        else:
            default = f"`{str(v.default).lower() if v.type is bool else v.default}`"
        kind = "list of integers" if v.type is list and v.items is int else type_names[v.type]
        if v.choices:
            kind += " (" + " \\| ".join(v.choices) + ")"
        elif v.type is int and (v.minimum is not None or v.maximum is not None):
            kind += f" ({v.expected().removeprefix('an integer ')})"
        doc = v.doc + (" **Secret**: masked in all output." if v.secret else "")
        lines.append(f"| `{v.name}` | {kind} | {default} | {v.scope} | {_cell(doc)} | "
                     f"`{_cell(v.example)}` |")
    return "\n".join(lines) + "\n"
