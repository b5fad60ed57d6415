"""Shared fixtures: the session's lab (``lab``) and testinfra hosts on it (``lab_host``).

Lab tests (``@pytest.mark.lab``) are skipped with a reason when not run as root. The lab
instance comes from ``VLLM_PROVISION_LAB_*`` (docs/architecture.md "Lab instances"); if it is
already up it is used as is and left up, otherwise it is brought up (2 hosts) and taken down
at the end of the session.

Under pytest-xdist (``-n N --dist loadfile``, docs/testing.md) each worker ``gw<i>`` gets a lab
instance of its own (:meth:`vllm_provision_lab.config.LabConfig.worker`: name ``<name>w<i>``,
the ``i+1``-th /24 after the configured one, state dir ``<dir>-w<i>``), sharing the base-image
cache; the workers boot their labs at once, each on its first lab test. The workers collect
the test modules in order of their stated cost (the ``Cost: about N s`` line of a lab module's
docstring), dearest first, so the scheduler starts the long modules first and fills in with the
short ones.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator

import pytest

# Every run of the suite approves the runs that would ask for approval
# (vllm_provision.operations.approval:
# up restarting a serving replica, down, --take-over), as CI would with --yes; the tests of the
# approval itself (tests/unit/test_approval.py, tests/lab/test_plan_status.py) remove it.
os.environ.setdefault("VLLM_PROVISION_YES", "1")

NOT_ROOT_REASON = ("lab tests need root (the lab mounts overlays and creates network namespaces); "
                   "run them as root, e.g. `sudo .venv/bin/pytest -m lab`")


COST_LINE = re.compile(r"^Cost: about (\d+) s\b", re.MULTILINE)


def _use_worker_instance() -> None:
    """In a pytest-xdist worker, select the worker's own lab instance for this process and
    every ``provision`` it starts (``VLLM_PROVISION_LAB_*`` in ``os.environ``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not re.fullmatch(r"gw\d+", worker):
        return
    try:
        from vllm_provision_lab.config import LabConfig
    except ImportError:  # the lab distribution is not installed: unit tests only
        return
    os.environ.update(LabConfig.from_env().worker(int(worker[2:])).environ())


_use_worker_instance()


def module_cost_s(module: object) -> int:
    """The seconds a test module says it costs (``Cost: about N s`` in its docstring), 0 when
    it says nothing (unit test modules)."""
    match = COST_LINE.search(getattr(module, "__doc__", None) or "")
    return int(match.group(1)) if match else 0


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """With ``--dist loadfile``, a scheduler that hands a worker its next module only when the
    worker is down to its last test (pytest-xdist's own waits for two or fewer): a worker whose
    module ends with two long tests no longer takes a long module early while another worker
    goes idle at the end of the run (docs/testing.md, "Module order"). Other modes: xdist's own.
    """
    if getattr(config.option, "dist", "") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LastTestScheduling(LoadFileScheduling):  # type: ignore[misc]
        """LoadFileScheduling, topping a worker up at one pending test instead of two."""

        def _reschedule(self, node: object) -> None:
            if node.shutting_down:  # type: ignore[attr-defined]
                return
            if not self.workqueue:
                node.shutdown()  # type: ignore[attr-defined]
                return
            # one pending test is the one the worker holds back until it knows the next item
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return LastTestScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: object) -> Iterator[None]:
    """With ``CI_TIMELINE`` set (a folder, as `.ci/run` sets it), append one line per test to
    ``<folder>/timeline-<worker>.tsv``: worker, test id, start and end (Unix seconds), so that
    `.ci/times.py` can say how busy each lab worker was and how long each sat idle at the end."""
    folder = os.environ.get("CI_TIMELINE")
    started = time.time()
    yield
    if folder:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(folder, f"timeline-{worker}.tsv"), "a", encoding="utf-8") as out:
            out.write(f"{worker}\t{item.nodeid}\t{started:.3f}\t{time.time():.3f}\n")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--lab-vllm``, and the options of the verify suite (tests/verify): the inventory of a
    deployed replica."""
    from vllm_provision.resources.verify import options

    parser.addoption("--lab-vllm", choices=("standin", "real"), default="standin",
                     help="the vLLM of a lab the session boots (docs/testing.md): standin, or "
                          "real (vLLM's CPU build, for `-m real_vllm`); a lab already up is "
                          "used as it is")
    options.pytest_addoption(parser)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, order the modules dearest first (stable: a module's tests keep
    their file order, and every worker collects the same order; without workers the order is
    the command line's); skip every ``lab``-marked test with a clear reason when not root."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        costs: dict[str, int] = {}
        for item in items:
            if item.nodeid.split("::")[0] not in costs:
                costs[item.nodeid.split("::")[0]] = module_cost_s(getattr(item, "module", None))
        items.sort(key=lambda item: -costs[item.nodeid.split("::")[0]])
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason=NOT_ROOT_REASON)
    for item in items:
        if item.get_closest_marker("lab") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def lab(pytestconfig: pytest.Config) -> Iterator[object]:
    """The session's :class:`vllm_provision_lab.Lab`, up with at least 2 hosts (booted with
    the vLLM of ``--lab-vllm`` when it is not up yet)."""
    if os.geteuid() != 0:
        pytest.skip(NOT_ROOT_REASON)
    from vllm_provision_lab import Lab

    instance = Lab.from_env()
    if instance.is_up():
        yield instance
        return
    instance.up(hosts=2, vllm="real" if pytestconfig.getoption("--lab-vllm") == "real"
                else "standin")
    try:
        yield instance
    finally:
        instance.down()


@pytest.fixture
def lab_host(lab: object) -> Iterator[Callable[..., object]]:
    """Factory ``lab_host(name, user="root") -> testinfra.host.Host`` over paramiko.

    testinfra's paramiko backend accepts unknown host keys (``WarningPolicy``) and ignores
    ``UserKnownHostsFile``, so the fixture hands it an already-connected paramiko client with
    ``RejectPolicy`` and the lab's known_hosts: host keys are checked strictly, as on real
    servers. Each call makes a fresh connection (safe across a reboot); all are closed after.
    """
    import paramiko
    import testinfra.backend
    import testinfra.host
    from vllm_provision_lab import Lab

    assert isinstance(lab, Lab)
    clients: list[paramiko.SSHClient] = []

    def connect(name: str, user: str = "root") -> testinfra.host.Host:
        address = next(h.address for h in lab.hosts if h.name == name)
        client = paramiko.SSHClient()
        client.load_host_keys(str(lab.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(address, username=user, key_filename=str(lab.key_file),
                       look_for_keys=False, allow_agent=False, timeout=10)
        clients.append(client)
        backend = testinfra.backend.get_backend(f"paramiko://{user}@{address}",
                                                ssh_identity_file=str(lab.key_file))
        backend.client = client  # type: ignore[attr-defined]  # fills the cached_property
        return testinfra.host.Host(backend)

    yield connect
    for client in clients:
        client.close()


@pytest.fixture(scope="session")
def built_dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The sdist and the wheel built from it, once per session: ``{"sdist": Path, "wheel":
    Path, "build_s": float}``.

    The sources are copied out of the checkout first (no .venv, .git or build outputs), so a
    stale ``build/`` folder cannot leak files into the wheel; the wheel is built by pip from the
    sdist (build isolation, setuptools from pyproject.toml), which proves the sdist complete.
    """
    import shutil
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    work = tmp_path_factory.mktemp("dists")
    source, dist = work / "src", work / "dist"
    started = time.monotonic()
    shutil.copytree(repo, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "bench"))
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                    "build_meta.build_sdist(sys.argv[1])", str(dist)],
                   cwd=source, check=True, capture_output=True, timeout=300)
    (sdist,) = dist.glob("*.tar.gz")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist),
                    str(sdist)], check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel, "build_s": time.monotonic() - started}
