"""Where the product keeps its own files on a host.

One folder, ``/var/lib/vllm-provision`` (systemd's ``StateDirectory=`` convention for
``/var/lib/<name>``, systemd.exec(5)): the state record, the run lock, pending notifications and
reload markers. The units and environment files live where systemd reads them
(``/etc/systemd/system``, ``/etc/vllm-provision``), named by the roles' defaults.
"""

STATE_DIR = "/var/lib/vllm-provision"
