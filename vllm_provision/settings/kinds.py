"""The kind of every value that leaves the inventory, and the rule each kind enforces.

Every variable of :data:`vllm_provision.settings.variables.VARIABLES` and every role default an
inventory may override (``roles/*/defaults/main.yml``, :func:`vllm_provision.settings.variables.
role_defaults`) has one kind in :data:`KINDS`; a unit test keeps the table complete. The loader
(:func:`vllm_provision.inventory.values.check_setting`) applies :func:`check` to each value at
load time, before any connection, after the type and control-character checks. The rules and
where they come from are in ``docs/security.md``.

A kind's checker takes a value already converted to its type and returns what was expected, in
words, or None when the value is fine.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vllm_provision.settings import instance

# Linux dev_valid_name() (net/core/dev.c): 1..15 bytes (IFNAMSIZ 16 with the NUL), not "." or
# "..", no "/", ":" or whitespace. We also refuse a leading "-" (it would read as an option of
# ip(8)) and keep to the characters udev and every distribution use.
INTERFACE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$")
# A path we write to or chown: the POSIX portable file name characters (POSIX.1-2017 3.282:
# A-Za-z0-9 . _ -) plus "/", "+" and "@". No "%" or "$" (systemd specifiers and variables in a
# unit file), no quotes or spaces (one word everywhere).
PATH_RE = re.compile(r"^/[A-Za-z0-9._+@/-]*$")
# A DNS name (RFC 1123 labels) or an IP address for ssh; "_" is accepted as ssh_config does.
SSH_HOST_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:%-]*$")
# An ssh login name: what useradd accepts plus "@" and "." (directory accounts), never a
# leading "-" (``ssh -l -oProxyCommand=...``).
SSH_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]*$")
# Version pins compared with pip's versions (PEP 440 public and local versions).
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_!-]*$")
# A declared replica id (``vllm_replica_id``, docs/deploy.md "Who owns a host"): a short
# printable word, 1-63 characters, so it reads the same in a message, a JSON record and a file
# name. No "@": derived ids (``core.models.derived_replica_id``) carry one, so a declared id never
# equals a derived one.
REPLICA_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# A check name of `provision check --skip-check` (host.shm, parity.vllm).
CHECK_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")

# Directories that are never ours to chown, chmod or remove, whatever a variable says: the
# Filesystem Hierarchy Standard 3.0 top-level and /usr, /var hierarchies, plus systemd's unit
# directories (systemd.unit(5) "UNIT FILE LOAD PATH").
SYSTEM_DIRS = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
    "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr",
    "/var", "/usr/bin", "/usr/include", "/usr/lib", "/usr/lib64", "/usr/libexec", "/usr/local",
    "/usr/local/bin", "/usr/local/etc", "/usr/local/lib", "/usr/local/sbin", "/usr/local/share",
    "/usr/sbin", "/usr/share", "/usr/src", "/var/cache", "/var/lib", "/var/local", "/var/lock",
    "/var/log", "/var/mail", "/var/opt", "/var/run", "/var/spool", "/var/tmp", "/etc/systemd",
    "/etc/systemd/system", "/run/systemd", "/run/systemd/system", "/lib/systemd",
    "/usr/lib/systemd", "/usr/lib/systemd/system", "/etc/ssh", "/etc/sudoers.d", "/root/.ssh",
})
# Where the directories we own live: ``<root>/<name starting with "vllm">[/...]``.
OWNED_ROOTS = ("/var/lib", "/var/cache", "/var/tmp", "/etc", "/opt", "/srv", "/usr/local/lib",
               "/run", "/data", "/mnt")
# systemd.unit(5) "UNIT FILE LOAD PATH": the system unit folders a unit may be installed in.
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system")
# Environment variables we set from other variables: vllm_env and vllm_node_env must not
# override them (one source for each value).
RESERVED_ENV = {
    "VLLM_HOST_IP": "it is this node's vllm_host_ip",
    "VLLM_API_KEY": "it comes from vllm_api_key, which keeps it out of output",
    # Ray token authentication is one setting for every Ray process of a replica
    # (settings/ray_auth.py): a value here would split the cluster or put the token in a file.
    "RAY_AUTH_MODE": "it comes from vllm_ray_auth",
    "RAY_AUTH_TOKEN": "the token is made per replica by the controller (vllm_ray_auth)",
    "RAY_AUTH_TOKEN_PATH": "it is the token file the ray role installs (vllm_ray_auth)",
}
# Set from vllm_cluster_interface when that is set (roles/vllm_common/templates/macros.j2).
INTERFACE_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# Set from vllm_gpus when that is set (the same macro): the GPUs a node's processes see.
GPU_SET_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def check_interface(value: str) -> str | None:
    """Return why ``value`` is not a network interface name, or None (Linux dev_valid_name)."""
    if _interface_ok(value):
        return None
    return "an interface name such as eth0 (1-15 of A-Za-z0-9_.-, not starting with '-')"


def _interface_ok(value: str) -> bool:
    return bool(INTERFACE_RE.match(value)) and value not in (".", "..")


def check_address(value: str) -> str | None:
    """Return why ``value`` is not an IP address, or None.

    An IPv6 zone id (``fe80::1%eth0``, RFC 6874) is accepted only when it is an interface name
    (:data:`INTERFACE_RE`): the text after ``%`` reaches commands and unit files.
    """
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return "an IP address such as 10.0.0.11"
    zone = getattr(address, "scope_id", None)
    if zone is not None and not _interface_ok(zone):
        return "an IPv6 zone id that is an interface name (fe80::1%eth0)"
    return None


def check_ssh_host(value: str) -> str | None:
    """Return why ``value`` cannot be an ssh address (a DNS name or an IP), or None."""
    if not SSH_HOST_RE.match(value):
        return "a host name or IP address (A-Za-z0-9_.:- , not starting with '-')"
    if "%" in value:
        return check_address(value)
    return None


def check_ssh_user(value: str) -> str | None:
    """Return why ``value`` cannot be an ssh or sudo user name, or None."""
    if not SSH_USER_RE.match(value):
        return "a user name such as deploy (A-Za-z0-9_.@-, not starting with '-')"
    return None


# useradd(8)'s portable user names.
USER_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]*[$]?$")


def check_user_name(value: str) -> str | None:
    """Return why ``value`` is not a portable user name per useradd(8), or None."""
    return None if USER_NAME_RE.match(value) else "a user name such as vllm ([a-z_][a-z0-9_-]*)"


def check_path(value: str) -> str | None:
    """Return why ``value`` is not an absolute, normalised path of safe characters, or None.

    Normalised: ``posixpath.normpath`` leaves it unchanged, so there is no ``..``, ``.``, ``//``
    or trailing ``/``.
    """
    if not value.startswith("/"):
        return "an absolute path such as /opt/vllm"
    if not PATH_RE.match(value):
        return "a path of A-Za-z0-9._+@-/ only (no spaces, quotes, '%' or '$')"
    parts = value.split("/")
    if ".." in parts or posixpath.normpath(value) != value or value.startswith("//"):
        return f"a normalised absolute path without '..' or '//' (such as " \
               f"{posixpath.normpath(value).replace('..', '').replace('//', '/')!r})"
    return None


def is_system_dir(value: str) -> bool:
    """True when ``value`` is one of :data:`SYSTEM_DIRS`."""
    return value.rstrip("/") in SYSTEM_DIRS or value == "/"


def is_owned_dir(value: str, allowed: Iterable[str] = ()) -> bool:
    """True when ``value`` is a directory we may own: below ``<root>/vllm*`` for a root of
    :data:`OWNED_ROOTS`, or equal to or below one of ``allowed`` (``provision_owned_dirs``)."""
    for extra in allowed:
        if value == extra or value.startswith(extra.rstrip("/") + "/"):
            return True
    for root in OWNED_ROOTS:
        if value.startswith(root + "/"):
            first = value[len(root) + 1:].split("/", 1)[0]
            if first.lower().startswith("vllm"):
                return True
    return False


def check_owned_dir(value: str, allowed: Iterable[str] = ()) -> str | None:
    """Return why we may not chown/chmod/remove directory ``value``, or None.

    Refused: anything :func:`check_path` refuses, a system directory (:data:`SYSTEM_DIRS`),
    and anything not below a prefix we own (:func:`is_owned_dir`).
    """
    wrong = check_path(value)
    if wrong is not None:
        return wrong
    if is_system_dir(value):
        return ("a directory of our own, not the system directory " + value
                + " (e.g. /var/lib/vllm/tmp)")
    if not is_owned_dir(value, allowed):
        return ("a directory below a prefix the tool owns (" + ", ".join(
            f"{r}/vllm*" for r in OWNED_ROOTS[:4]) + ", ...) or listed in provision_owned_dirs")
    return None


def check_owned_file(value: str, allowed: Iterable[str] = ()) -> str | None:
    """Return why ``value`` is not a file inside a directory we own, or None."""
    wrong = check_path(value)
    if wrong is not None:
        return wrong
    parent = posixpath.dirname(value)
    if check_owned_dir(parent, allowed) is not None:
        return "a file inside a directory the tool owns (such as /etc/vllm-provision/vllm.env)"
    return None


def check_unit_dir(value: str) -> str | None:
    """Return why ``value`` is not a system unit folder (systemd.unit(5)), or None."""
    return None if value in UNIT_DIRS else "one of " + ", ".join(UNIT_DIRS)


# systemd.unit(5): a unit name is [A-Za-z0-9:_.\\-]+ with a type suffix. We also refuse a
# leading "-" or "." (systemctl would read "-x.service" as an option) and "..".
UNIT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9:_.\\-]*(@[A-Za-z0-9:_.\\-]*)?\.service$")


def check_unit(value: str) -> str | None:
    """Return why ``value`` is not a safe ``.service`` unit name, or None."""
    if not UNIT_RE.match(value) or ".." in value or len(value) > 255:
        return "a unit name such as vllm.service (A-Za-z0-9:_.-, ending in .service)"
    return None


# A distribution package name: Debian Policy 5.6.1 ("Package": lower case letters, digits, + - .,
# at least two characters, starting alphanumeric); RPM names may also hold upper case and "_".
# A leading "-" would be read by apt-get or dnf as an option.
PACKAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9+._-]{1,127}$")


def check_package(value: str) -> str | None:
    """Return why ``value`` is not a distribution package name (:data:`PACKAGE_RE`), or None."""
    if not PACKAGE_RE.match(value):
        return ("a package name such as prometheus-node-exporter (A-Za-z0-9 + . _ -, starting "
                "with a letter or digit)")
    return None


def check_engine_word(value: str) -> str | None:
    """Return why ``value`` cannot be a positional or option value of ``vllm serve``, or None:
    a leading ``-`` would make argparse read it as an option."""
    if value.startswith("-"):
        return "a value that does not start with '-' (vllm serve would read it as an option)"
    if not value:
        return "a non-empty value"
    return None


def check_env_mapping(value: Mapping[str, Any]) -> str | None:
    """Return why a ``vllm_env`` mapping overrides a variable we set, or None."""
    for key in value:
        if key in RESERVED_ENV:
            return (f"no {key} ({RESERVED_ENV[key]}; set that variable instead)")
    return None


def check_version(value: str) -> str | None:
    """Return why ``value`` is not a version pin (PEP 440 characters), or None."""
    return None if VERSION_RE.match(value) else "a version such as 0.12.0 or 2.9.0+cu129"


def check_replica_id(value: str) -> str | None:
    """Return why ``value`` cannot be a declared replica id (:data:`REPLICA_ID_RE`), or None."""
    if REPLICA_ID_RE.match(value):
        return None
    return ("a replica id of 1-63 characters A-Za-z0-9 . _ -, starting with a letter or digit, "
            "such as llm-prod")


def check_check_names(value: list[str]) -> str | None:
    """Return why a list of check names holds something else, or None."""
    for item in value:
        if not CHECK_NAME_RE.match(item):
            return f"check names such as host.shm (bad item {item!r})"
    return None


def check_severities(value: Any) -> str | None:
    """Return why ``preflight_parity`` is not a mapping of item -> error|warning|off, or None."""
    if not isinstance(value, Mapping):
        return "a mapping of parity items to error, warning or off"
    for key, item in value.items():
        if not isinstance(key, str) or not CHECK_NAME_RE.match(key) or item not in (
                "error", "warning", "off"):
            return f"a mapping of parity items to error, warning or off (bad item {key!r})"
    return None


def check_port(value: Any) -> str | None:
    """Return why ``value`` is not a TCP port 1-65535, or None (a role default's port, whose
    type the table does not bound)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        return "a TCP port, an integer 1-65535"
    return None


def check_text(value: str) -> str | None:
    """Plain single-line text (control characters are refused before kinds run)."""
    return None


def check_whole_seconds(value: Any) -> str | None:
    """Return why ``value`` is not a whole number of seconds >= 1, or None: Ray reads its
    compiled-graph timeouts with ``int()`` (ray/dag/context.py), so ``2.5`` would stop Ray."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1 or \
            int(value) != value:
        return "a whole number of seconds >= 1 (Ray reads it with int())"
    return None


Checker = Callable[[Any], str | None]

# kind -> its rule. A kind not listed has none here: its values are checked by their type and
# range (``settings/variables.py``), by their table entry or by ``check_setting`` itself, as the
# comments in KINDS say.
RULES: dict[str, Checker] = {
    "ssh_host": check_ssh_host,
    "ssh_user": check_ssh_user,
    "replica_id": check_replica_id,
    "address": check_address,
    "interface": check_interface,
    "engine_arg": check_engine_word,
    "env": check_env_mapping,
    "path": check_path,
    "unit": check_unit,
    "owned_dir": check_owned_dir,
    "owned_file": check_owned_file,
    "unit_dir": check_unit_dir,
    "package": check_package,
    "version": check_version,
    "check_names": check_check_names,
}
# variable -> a rule of its own, narrower than its kind's (which has none).
OWN_RULES: dict[str, Checker] = {
    "vllm_watchdog_port": check_port,  # a role default: no table entry bounds it
    "ray_cgraph_get_timeout_s": check_whole_seconds,
    "ray_cgraph_submit_timeout_s": check_whole_seconds,
    "preflight_parity": check_severities,
    "vllm_firewall_table": instance.check_firewall_table,
}

# name -> kind. Kinds: name, unit, path, owned_dir, owned_file, unit_dir, address, ssh_host,
# ssh_user, ssh_args, port, cidr_list, interface, engine_arg, engine_args, env, secret, version,
# count, seconds, rate, fraction, flag, choice, text, data, replica_id, package, gpu_indexes.
KINDS: dict[str, str] = {
    # connection
    "ansible_host": "ssh_host",
    "ansible_port": "port",
    "ansible_user": "ssh_user",
    "ansible_ssh_private_key_file": "controller_path",
    "ansible_ssh_common_args": "ssh_args",
    "ansible_ssh_extra_args": "ssh_args",
    "ansible_become": "flag",
    "ansible_become_user": "ssh_user",
    "provision_known_hosts_file": "controller_path",
    "provision_owned_dirs": "path_list",  # checked by check_setting itself
    # replica and nodes
    "vllm_backend": "choice",
    "vllm_replica_id": "replica_id",
    "vllm_node_rank": "count",
    "vllm_host_ip": "address",
    "vllm_cluster_interface": "interface",
    "vllm_device": "choice",
    "vllm_gpus": "gpu_indexes",  # checked by its table entry (check_gpu_indexes)
    # engine arguments
    "vllm_model": "engine_arg",
    "vllm_served_model_name": "engine_arg",
    "vllm_tensor_parallel_size": "count",
    "vllm_pipeline_parallel_size": "count",
    "vllm_max_model_len": "count",
    "vllm_data_parallel_size": "count",
    "vllm_data_parallel_size_local": "count",
    "vllm_data_parallel_layout": "choice",
    "vllm_data_parallel_rpc_port": "port",
    "vllm_gpu_memory_utilization": "fraction",  # checked by check_fraction
    "vllm_api_host": "address",
    "vllm_api_via": "choice",
    "vllm_api_port": "port",
    "vllm_master_port": "port",
    "vllm_extra_args": "engine_args",
    "vllm_api_key": "secret",
    "vllm_hf_token": "secret",
    "vllm_env": "env",
    "vllm_node_env": "env",
    # service
    "vllm_venv": "path",
    "vllm_stack_lock": "controller_path",
    "vllm_instance": "name",  # checked by its table entry (settings/instance.py)
    "vllm_service_user": "name",
    "vllm_service_group": "name",
    "vllm_unit_name": "unit",
    "vllm_ready_timeout_s": "seconds",
    "vllm_stall_timeout_s": "seconds",  # checked by its table entry
    "vllm_load_rate_mib_s": "rate",  # MiB/s > 0: its table entry checks
    "vllm_phase_budgets_s": "data",  # phase -> seconds; its table entry checks
    "vllm_command_output_limit_mib": "count",
    "vllm_gpu_pool": "choice",
    "vllm_gpu_wait_timeout_s": "seconds",
    "vllm_state_dir": "owned_dir",
    "vllm_cache_dir": "owned_dir",
    "vllm_tmp_dir": "owned_dir",
    "vllm_config_dir": "owned_dir",
    "vllm_env_file": "owned_file",
    "ray_env_file": "owned_file",
    "vllm_unit_dir": "unit_dir",
    "vllm_restart_sec": "seconds",
    "vllm_start_limit_interval_s": "seconds",
    "vllm_start_limit_burst": "count",
    "vllm_timeout_start_sec": "seconds",
    "vllm_timeout_stop_sec": "seconds",
    "vllm_limit_nofile": "count",
    # ray
    "ray_port": "port",
    "ray_node_manager_port": "port",
    "ray_object_manager_port": "port",
    "ray_client_server_port": "port",
    "ray_min_worker_port": "port",
    "ray_max_worker_port": "port",
    "ray_dashboard_agent_listen_port": "port",
    "ray_dashboard_agent_grpc_port": "port",
    "ray_runtime_env_agent_port": "port",
    "ray_metrics_export_port": "port",
    "ray_include_dashboard": "flag",
    "ray_dashboard_port": "port",
    "ray_num_gpus": "count",
    "ray_num_cpus": "count",
    "ray_memory_bytes": "count",
    "ray_object_store_memory_bytes": "count",
    "ray_head_unit_name": "unit",
    "ray_worker_unit_name": "unit",
    "ray_restart_sec": "seconds",
    "ray_start_limit_interval_s": "seconds",
    "ray_start_limit_burst": "count",
    "ray_timeout_start_sec": "seconds",
    "ray_timeout_stop_sec": "seconds",
    "ray_limit_nofile": "count",
    "ray_gcs_timeout_s": "seconds",
    "ray_cluster_timeout_s": "seconds",
    # firewall
    "vllm_firewall": "choice",
    "vllm_api_allow_from": "cidr_list",  # checked by its table entry
    # monitoring
    "vllm_monitoring": "choice",
    "vllm_node_exporter_port": "port",
    "vllm_gpu_exporter": "choice",
    "vllm_gpu_exporter_port": "port",
    "vllm_metrics_allow_from": "cidr_list",  # checked by its table entry
    "vllm_node_exporter_package": "package",
    "vllm_node_exporter_service": "unit",
    "vllm_node_exporter_binary": "path",
    "vllm_firewall_file": "owned_file",
    "vllm_firewall_unit_name": "unit",
    "vllm_firewall_nft": "path",
    "vllm_firewall_table": "name",
    "ray_cgraph_get_timeout_s": "seconds",
    "ray_cgraph_submit_timeout_s": "seconds",
    "vllm_ray_auth": "choice",
    "ray_env": "env",
    # monitoring
    "vllm_alert_ttft_p99_s": "seconds",  # checked by its table entry
    "vllm_alert_down_for_s": "seconds",
    # the front door (docs/front-door.md)
    "vllm_gateway_port": "port",
    "vllm_gateway_host": "address",
    "vllm_gateway_metrics_port": "port",
    "vllm_gateway_policy": "choice",
    "vllm_gateway_health_check_interval_s": "seconds",
    "vllm_gateway_health_check_timeout_s": "seconds",
    "vllm_gateway_health_failure_threshold": "count",
    "vllm_gateway_request_timeout_s": "seconds",
    "vllm_gateway_venv": "path",
    "vllm_gateway_wheelhouse": "controller_path",
    "vllm_gateway_unit_name": "unit",
    "vllm_gateway_unit_dir": "unit_dir",
    # versions
    "vllm_version": "version",
    "torch_version": "version",
    "nccl_version": "version",
    "ray_version": "version",
    # watchdog
    "vllm_watchdog_unit_name": "unit",
    "vllm_watchdog_dir": "owned_dir",
    "vllm_watchdog_script": "owned_file",
    "vllm_watchdog_config": "owned_file",
    "vllm_watchdog_python": "path",
    "vllm_watchdog_port": "port",
    "vllm_watchdog_poll_s": "seconds",
    "vllm_watchdog_grace_s": "seconds",
    "vllm_watchdog_slack_s": "seconds",
    "vllm_watchdog_restart_wait_s": "seconds",
    "vllm_watchdog_probe_interval_s": "seconds",
    "vllm_watchdog_probe_timeout_s": "seconds",
    "vllm_watchdog_probe_failures": "count",
    "vllm_watchdog_hold_file": "owned_file",
    "vllm_watchdog_state_file": "owned_file",
    # preflight
    "preflight_parity": "data",
    "preflight_min_shm_mib": "count",
    "preflight_gpu_overhead_mib": "count",
    "preflight_nccl_loaded": "flag",
    "preflight_model_sha256": "flag",
    "preflight_reach_timeout_s": "seconds",
    "preflight_skip_checks": "check_names",
    "preflight_placement_bundles": "data",
    "preflight_placement_strategy": "choice",
}

# Kinds whose rule is about the shape of the text: a Jinja template in their place is refused
# (it could not be checked before it is rendered).
STRUCTURED = frozenset({"unit", "path", "owned_dir", "owned_file", "unit_dir", "address",
                        "ssh_host", "ssh_user", "interface", "name", "port", "count", "seconds",
                        "replica_id", "package"})
# Kinds that take provision_owned_dirs into account.
OWNED = frozenset({"owned_dir", "owned_file"})
# preflight_placement_strategy: Ray's placement strategies (ray.util.placement_group).
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def kind_of(name: str) -> str | None:
    """Return the kind of variable ``name``, or None for a variable we do not read."""
    return KINDS.get(name)


def check(name: str, value: Any, owned_dirs: Iterable[str] = ()) -> str | None:
    """Apply ``name``'s rule to ``value`` (already of the right type): its own
    (:data:`OWN_RULES`) when it has one, else its kind's (:data:`RULES`, :data:`KINDS`).

    Args:
        name: a variable of :data:`KINDS`; others pass.
        value: the converted value.
        owned_dirs: extra directories declared ours (``provision_owned_dirs``).

    Returns:
        what was expected, in words, or None when the value is fine.
    """
    kind = KINDS.get(name)
    if kind is None:
        return None
    if kind in OWNED and isinstance(value, str):
        return (check_owned_dir if kind == "owned_dir" else check_owned_file)(value, owned_dirs)
    if kind == "name" and isinstance(value, str):
        return check_user_name(value)
    if name == "preflight_placement_strategy" and value not in PLACEMENT_STRATEGIES:
        return "one of " + ", ".join(PLACEMENT_STRATEGIES)
    checker = OWN_RULES.get(name) or RULES.get(kind)
    return None if checker is None else checker(value)
