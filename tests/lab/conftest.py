"""Fixtures of the lab tests: the session's broker of deployed replicas (``replicas``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lab_support import ReplicaBroker


@pytest.fixture(scope="session")
def replicas(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaBroker]:
    """The session's :class:`lab_support.ReplicaBroker` on ``lab``: ``replicas.serving("mp")``
    for a module that only reads the lab's mp replica, ``replicas.exclusive(...)`` for one that
    changes or breaks it (and says what it leaves). What it deployed stays on the hosts after
    the session (the lab fixture takes a lab it brought up down whole)."""
    broker = ReplicaBroker(lab, tmp_path_factory.mktemp("replicas"))
    yield broker
    print(f"\nreplica broker runs: {broker.log}")


@pytest.fixture(scope="module", autouse=True)
def _no_broker_replica_serving_for_modules_outside_it(request: pytest.FixtureRequest) -> None:
    """A lab module that does not ask for ``replicas`` starts, as before the broker, with no
    replica of ours serving: the one the broker left serving is taken down first
    (:meth:`ReplicaBroker.stop_serving`). Nothing is done for the broker's own users or for
    modules that do not use the lab."""
    used = [set(getattr(item, "fixturenames", ())) for item in request.session.items
            if getattr(item, "module", None) is request.module]
    if any("lab" in names for names in used) and not any("replicas" in names for names in used):
        request.getfixturevalue("replicas").stop_serving()
