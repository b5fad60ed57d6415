"""Run one call per host in threads and sort the outcomes into results and errors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
Failure = TypeVar("Failure", bound=BaseException)


def split_map(one: Callable[[Item], tuple[str, Result | Failure]], items: Sequence[Item], *,
              workers: int, failure: type[Failure],
              ) -> tuple[dict[str, Result], dict[str, Failure]]:
    """Call ``one`` on every item in a pool of threads; each call returns ``(host name,
    outcome)``, an outcome that is an instance of ``failure`` is an error, any other a result.

    Args:
        one: the call for one item; it returns its errors of type ``failure`` instead of
            raising them (any other exception propagates, as from ``Executor.map``).
        items: the items (hosts or host names); none: no pool is started.
        workers: the most threads at once (at least 1 is used).
        failure: the error type, e.g. ``ProvisionError``.

    Returns:
        ``(results by host name, errors by host name)``: every item's name is in exactly one.
    """
    results: dict[str, Result] = {}
    errors: dict[str, Failure] = {}
    if not items:
        return results, errors
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for name, outcome in pool.map(one, items):
            if isinstance(outcome, failure):
                errors[name] = outcome
            else:
                results[name] = outcome
    return results, errors
