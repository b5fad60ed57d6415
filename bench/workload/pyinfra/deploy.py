"""Benchmark workload, pyinfra form (bench/README.md): the same 8 tasks and 1 handler as
../roles/bench_units (vllm-provision) and ../ansible/site.yml, rendering the same templates.

Run: ``BENCH_INVENTORY=inv.yml pyinfra -y inventory.py deploy.py`` from this folder. The facts
command is a pyinfra fact (read while pyinfra plans, once per host); the handler is an operation
run only when a template changed (``_if``), the daemon-reload only when a unit file changed.
"""

from pathlib import Path

from pyinfra import host
from pyinfra.facts.server import Command
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

TEMPLATES = Path(__file__).resolve().parent.parent / "roles" / "bench_units" / "templates"
UNIT_DIR = "/etc/systemd/system"
ENV_DIR = "/etc/default"

# the one facts command
kernel = host.get_fact(Command, command="uname -r")
data = {"inventory_hostname": host.name, "bench_kernel": {"stdout": kernel},
        "bench_env_dir": ENV_DIR, "bench_payload": "vllm-provision benchmark workload"}

env_a = files.template(name="Install the env file of bench-a",
                       src=str(TEMPLATES / "bench-a.env.j2"), dest=f"{ENV_DIR}/bench-a",
                       user="root", group="root", mode="644", **data)
env_b = files.template(name="Install the env file of bench-b",
                       src=str(TEMPLATES / "bench-b.env.j2"), dest=f"{ENV_DIR}/bench-b",
                       user="root", group="root", mode="644", **data)
unit_a = files.template(name="Install the unit bench-a", src=str(TEMPLATES / "bench-a.service.j2"),
                        dest=f"{UNIT_DIR}/bench-a.service", user="root", group="root", mode="644",
                        **data)
unit_b = files.template(name="Install the unit bench-b", src=str(TEMPLATES / "bench-b.service.j2"),
                        dest=f"{UNIT_DIR}/bench-b.service", user="root", group="root", mode="644",
                        **data)
systemd.daemon_reload(name="Reload systemd if a unit file changed",
                      _if=any_changed(unit_a, unit_b))
systemd.service(name="Enable and start bench-a", service="bench-a.service", running=True,
                enabled=True)
systemd.service(name="Enable and start bench-b", service="bench-b.service", running=True,
                enabled=True)
# the handler: at the end, only when a template changed
server.shell(name="Restart the bench units",
             commands=["systemctl try-restart bench-a.service bench-b.service"],
             _if=any_changed(env_a, env_b, unit_a, unit_b))
