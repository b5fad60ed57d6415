"""The replica's Python stack from one lock: parse, compare, lock, sync, roll back (docs/stack.md).

vLLM asks for "an identical execution environment" on every node (vLLM docs,
``serving/parallelism_scaling.md``); Ray refuses a node whose Ray or Python patch version differs
(ray #50511). A lock makes that true by construction:

- **The lock** (``vllm_stack_lock``, a path beside the inventory) is a requirements file with
  every distribution pinned (``name==version``) and its sha256 hashes, as ``uv pip compile
  --generate-hashes`` writes it, for the nodes' platform and Python (read from the nodes), with a
  header of ours (``# platform:``, ``# python:``). pip's hash-checking mode installs only those
  files (pip docs, "Secure installs": ``--require-hashes``).
- **Sync** pushes the wheels a node lacks (stored by sha256, checked on arrival), installs them
  with ``--no-index --require-hashes`` into a new venv ``<vllm_venv>.stack-<id>`` and checks it,
  then points ``vllm_venv`` (a symlink the units run through) at it with one rename(2)
  (``vllm_provision/stack/node.py``). The previous stack is kept for rollback.

The modules:

- :mod:`vllm_provision.stack.lock`: the lock file: parse (:func:`~.lock.parse_lock`), read,
  find (``vllm_stack_lock``), identify (:func:`~.lock.lock_id`), compare with a node
  (:func:`~.lock.compare`), and write it with uv (:func:`~.lock.compile_lock`); no host I/O.
- :mod:`vllm_provision.stack.sync`: the controller's side towards the nodes: probe them
  (:class:`~.sync.NodeStack`), choose and download the wheels (:func:`~.sync.wheel_plan`,
  :func:`~.sync.disk_need`), push, build and switch (:func:`~.sync.build_node`,
  :func:`~.sync.switch_node`).
- ``node.py``: the script those steps run on each node (its standard library only).
"""
