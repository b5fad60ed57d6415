"""Backends: the ways a replica runs (mp, ray, ...).

:mod:`vllm_provision.backends.base` holds the :class:`Backend` type and the registry, in the
package's lowest room (every room asks a replica's backend instead of comparing its name);
:mod:`vllm_provision.backends.choice` holds vLLM's default-backend rule. The implementations,
:mod:`vllm_provision.backends.mp` and :mod:`vllm_provision.backends.ray`, sit above the pipeline's
rooms and use them; each registers its class with ``@builtin(order=...)`` and the registry
imports this package's modules on the first look-up (docs/architecture.md, "Extending").
"""

from vllm_provision.backends.base import (
    BUILTINS,
    ENTRY_POINT_GROUP,
    PHASES,
    UNIT_KINDS,
    WATCHDOG_UNIT,
    Backend,
    Names,
    builtin,
    find,
    get,
    names,
    of,
    register,
    unit_var,
    unregister,
)

__all__ = ["BUILTINS", "ENTRY_POINT_GROUP", "PHASES", "UNIT_KINDS", "WATCHDOG_UNIT", "Backend",
           "Names", "builtin", "find", "get", "names", "of", "register", "unit_var", "unregister"]
