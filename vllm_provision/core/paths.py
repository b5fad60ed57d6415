"""Where the product keeps its own files on a host.

One folder, ``/var/lib/vllm-provision`` (systemd's ``StateDirectory=`` convention for
``/var/lib/<name>``, systemd.exec(5)): the state record, the run lock, pending notifications and
reload markers. The units and environment files live where systemd reads them
(``/etc/systemd/system``, ``/etc/vllm-provision``), named by the roles' defaults.
"""

STATE_DIR = "/var/lib/vllm-provision"

# The line every unit file this product installs carries in its first 3 lines: the roles'
# *.service.j2 templates begin with it, and the template and copy modules stamp it on a unit
# file whose text lacks it (a plugin backend's). ``down --purge`` and ``--take-over`` refuse to
# touch a unit file without it (vllm_provision/state/prune.py, docs/security.md).
UNIT_MARKER = "# managed by vllm-provision"
