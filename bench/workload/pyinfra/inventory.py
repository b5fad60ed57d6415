"""pyinfra inventory of the benchmark: the hosts of group ``bench`` in the Ansible YAML inventory
named by the environment variable ``BENCH_INVENTORY`` (written by bench/make_inventory.py).

Maps Ansible's connection variables to pyinfra's: ansible_host -> ssh_hostname, ansible_port ->
ssh_port, ansible_user -> ssh_user, ansible_ssh_private_key_file -> ssh_key, and the
``-o UserKnownHostsFile=`` of ansible_ssh_common_args -> ssh_known_hosts_file, with strict host
key checking (as the other two tools). Only ``all.vars`` and host vars are read: the benchmark's
inventory has nothing else.
"""

import os
import shlex

import yaml

with open(os.environ["BENCH_INVENTORY"], encoding="utf-8") as _file:
    _tree = yaml.safe_load(_file)["all"]


def _pyinfra_data(values: dict) -> dict:
    data = {"ssh_hostname": values["ansible_host"],
            "ssh_port": int(values.get("ansible_port", 22)),
            "ssh_user": values.get("ansible_user", "root"),
            "ssh_strict_host_key_checking": "yes"}
    if "ansible_ssh_private_key_file" in values:
        data["ssh_key"] = values["ansible_ssh_private_key_file"]
    for word in shlex.split(values.get("ansible_ssh_common_args", "")):
        if word.startswith("UserKnownHostsFile="):
            data["ssh_known_hosts_file"] = word.split("=", 1)[1]
    return data


_all_vars = _tree.get("vars") or {}
_hosts = _tree["children"]["bench"]["hosts"]
bench = [(name, _pyinfra_data({**_all_vars, **(values or {})})) for name, values in _hosts.items()]
