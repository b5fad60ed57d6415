"""Jinja2 for playbooks: one sandboxed StrictUndefined environment, lazily resolved variables.

Variable values may themselves be templates (``vllm_host_ip: "{{ ansible_host }}"``, as in
Ansible role defaults); they are rendered on first use, with a cycle check, and only the names a
template actually uses are resolved (``jinja2.meta.find_undeclared_variables``); modules see the
variables through :class:`LazyVars`, which renders a variable only when it is read.

Templates run in Jinja2's :class:`~jinja2.sandbox.ImmutableSandboxedEnvironment`: no attribute
starting with ``_`` (``lipsum.__globals__``), no call of an unsafe method, no change to a list or
mapping in place (templates build new ones with ``+`` and the ``combine`` filter). A value read
with Ansible's ``!unsafe`` tag (:class:`~vllm_provision.inventory.source.UnsafeText`) is never
rendered, as in Ansible ("Unsafe or raw strings", Ansible docs).
"""

from __future__ import annotations

import posixpath
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox

from vllm_provision.core import quoting
from vllm_provision.core.errors import ProvisionError
from vllm_provision.inventory.source import UnsafeText
from vllm_provision.settings import ray_auth

_MARKERS = ("{{", "{%")
# Compiled sources kept per environment (a run renders the same few templates and expressions
# for every task x host); past this many, the cache is emptied and refilled.
CACHE_LIMIT = 4096
_ENVIRONMENTS: dict[tuple[str, ...], jinja2.Environment] = {}
_ENVIRONMENTS_LOCK = threading.Lock()


class _Compiled:
    """One environment's compiled sources: the parse result (its free names, whether it
    includes other files), the compiled template and the compiled expression, by source text.
    Jinja2's compiled templates hold no render state (a render makes its own context), so one
    copy serves every host and thread."""

    def __init__(self) -> None:
        self.parsed: dict[str, tuple[frozenset[str], bool]] = {}
        self.templates: dict[str, jinja2.Template] = {}
        self.expressions: dict[str, Callable[..., Any]] = {}

    def remember(self, table: dict[str, Any], key: str, value: Any) -> Any:
        if len(table) >= CACHE_LIMIT:
            table.clear()
        table[key] = value
        return value


def _compiled(env: jinja2.Environment) -> _Compiled:
    cache = getattr(env, "_vllm_provision_compiled", None)
    if cache is None:
        cache = _Compiled()
        env._vllm_provision_compiled = cache  # type: ignore[attr-defined]
    return cache


def environment_for(search_path: list[Path] | None = None) -> jinja2.Environment:
    """Return the process's one environment of :func:`make_environment` for ``search_path``,
    built on first use: a run compiles each template and expression once (compiled sources are
    kept with the environment), not once per task x host.

    Args:
        search_path: as for :func:`make_environment`.
    """
    key = tuple(str(p) for p in search_path or ())
    with _ENVIRONMENTS_LOCK:
        env = _ENVIRONMENTS.get(key)
        if env is None:
            env = _ENVIRONMENTS[key] = make_environment(search_path)
        return env


def make_environment(search_path: list[Path] | None = None) -> jinja2.Environment:
    """Return the engine's Jinja2 environment: an ImmutableSandboxedEnvironment with
    StrictUndefined, trailing newline kept, and the filters ``bool``, ``quote``, ``combine``
    (Ansible's, a new mapping), ``dirname`` (Ansible's: a remote path's folder),
    ``systemd_exec_quote``, ``env_file_line``, ``nftables_ruleset``
    (:func:`vllm_provision.settings.firewall.ruleset`) and ``ray_auth_env``
    (:func:`vllm_provision.settings.ray_auth.auth_env` of a mapping holding ``vllm_ray_auth``
    and ``vllm_state_dir``).

    Args:
        search_path: folders for ``{% include %}`` / ``{% import %}`` (role templates first).
    """
    loader = jinja2.FileSystemLoader([str(p) for p in search_path]) if search_path else None
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, loader=loader,
        autoescape=False)
    env.filters["bool"] = _to_bool
    env.filters["combine"] = _combine
    env.filters["quote"] = _quote
    # A file installed beside another (role vllm_watchdog: the rules beside the script).
    env.filters["dirname"] = posixpath.dirname
    # Unit and env-file templates quote through these (roles vllm_mp, ray, vllm_ray).
    env.filters["systemd_exec_quote"] = quoting.systemd_exec_quote
    env.filters["env_file_line"] = quoting.env_file_line
    # The firewall template renders the replica's table through it (role vllm_firewall).
    env.filters["nftables_ruleset"] = _nftables_ruleset
    # Ray's authentication environment (roles ray, vllm_ray, vllm_watchdog): one rule.
    env.filters["ray_auth_env"] = ray_auth.auth_env
    return env


def _nftables_ruleset(replica: Any, allow_from: Any = (), metrics_from: Any = (),
                      exporters: Any = (), metrics_port: Any = None, gateway: Any = None) -> str:
    """``exporters``: the four monitoring variables' values, in
    :func:`~vllm_provision.settings.monitoring.exporter_ports`' order; ``gateway``: the host's
    front door (``inventory.gateways.Gateway``) or None."""
    from vllm_provision.settings import firewall, monitoring

    ports = monitoring.exporter_ports(*exporters) if exporters else []
    return firewall.ruleset(replica, allow_from or (), metrics_from or (), ports,
                            metrics_port if isinstance(metrics_port, int) else None,
                            (gateway.port, gateway.metrics_port) if gateway is not None
                            else None)


def _to_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "yes", "true", "on", "y")
    return bool(value)


def _combine(*mappings: Any) -> dict[str, Any]:
    """Ansible's ``combine`` filter (shallow): a new mapping, later keys winning."""
    merged: dict[str, Any] = {}
    for mapping in mappings:
        if not isinstance(mapping, Mapping):
            raise jinja2.TemplateRuntimeError(f"combine expects mappings, got {type(mapping)}")
        merged.update(mapping)
    return merged


def _quote(value: Any) -> str:
    from vllm_provision.modules import quote

    return quote(value)


def is_template(value: Any) -> bool:
    """True when ``value`` is a string holding Jinja2 markup and not marked ``!unsafe``."""
    return (isinstance(value, str) and not isinstance(value, UnsafeText)
            and any(marker in value for marker in _MARKERS))


def _sandbox_error(where: str, label: str, exc: jinja2.sandbox.SecurityError) -> ProvisionError:
    return ProvisionError.single(
        f"{where}: {label}", f"template refused by the sandbox: {exc}",
        expected="a template that only reads variables and uses filters",
        fix="remove the expression; a value from the inventory or -e is data, not code (write "
            "it with !unsafe to keep '{{' literally)")


class Templar:
    """Renders templates and evaluates expressions over one host's layered variables.

    Args:
        env: from :func:`make_environment`.
        variables: name -> raw value (templated strings allowed), already in precedence order.
        where: label for error messages (``"h1"``).
    """

    def __init__(self, env: jinja2.Environment, variables: Mapping[str, Any], where: str,
                 fixed: Mapping[str, Any] | None = None) -> None:
        self.env = env
        self.fixed = dict(fixed or {})
        self.raw = {**variables, **self.fixed}
        self.where = where
        self._resolved: dict[str, Any] = dict(self.fixed)
        self._resolving: list[str] = []

    def with_vars(self, extra: Mapping[str, Any]) -> Templar:
        """Return a Templar with ``extra`` (taken as is, not rendered) on top."""
        raw = {k: v for k, v in self.raw.items() if k not in self.fixed}
        return Templar(self.env, raw, self.where, {**self.fixed, **extra})

    def get(self, name: str) -> Any:
        """Return variable ``name`` fully rendered.

        Raises:
            KeyError: no such variable.
            ProvisionError: its value references an undefined variable or itself.
        """
        if name in self._resolved:
            return self._resolved[name]
        if name not in self.raw:
            raise KeyError(name)
        if name in self._resolving:
            cycle = " -> ".join([*self._resolving[self._resolving.index(name):], name])
            raise ProvisionError.single(self.where, f"variable refers to itself: {cycle}",
                                        fix="give one of these variables a plain value")
        self._resolving.append(name)
        try:
            value = self._resolve_value(self.raw[name], f"variable {name}")
        finally:
            self._resolving.pop()
        self._resolved[name] = value
        return value

    def lazy(self) -> LazyVars:
        """Return the variables as a mapping that renders each one only when it is read."""
        return LazyVars(self)

    def resolved(self) -> dict[str, Any]:
        """Return every variable that can be rendered (unrenderable ones are left out).

        Renders EVERY variable: only for templates that ``{% include %}`` other files (whose
        names cannot be known up front); modules get :meth:`lazy` instead.
        """
        out: dict[str, Any] = {}
        for name in self.raw:
            try:
                out[name] = self.get(name)
            except ProvisionError:
                continue
        return out

    def render_value(self, value: Any, label: str) -> Any:
        """Render every template string inside ``value`` (mappings and lists walked); a string
        that is one ``{{ expression }}`` keeps the expression's type."""
        return self._resolve_value(value, label)

    def _resolve_value(self, value: Any, label: str) -> Any:
        if is_template(value):
            return self._render_value(value, label)
        if isinstance(value, Mapping):
            return {k: self._resolve_value(v, label) for k, v in value.items()}
        if isinstance(value, list):
            return [self._resolve_value(v, label) for v in value]
        return value

    def _render_value(self, text: str, label: str) -> Any:
        # A value that is exactly one expression keeps its type ("{{ 4 }}" -> 4, lists stay lists).
        stripped = text.strip()
        if (stripped.startswith("{{") and stripped.endswith("}}")
                and stripped.count("{{") == 1 and "{%" not in stripped):
            return self.evaluate(stripped[2:-2], label)
        return self.render(text, label)

    def _context_for(self, source: str, label: str) -> dict[str, Any]:
        cache = _compiled(self.env)
        parsed = cache.parsed.get(source)
        if parsed is None:
            try:
                ast = self.env.parse(source)
            except jinja2.TemplateSyntaxError as exc:
                raise ProvisionError.single(f"{self.where}: {label}",
                                            f"Jinja2 syntax error: {exc.message}",
                                            actual=source[:200]) from None
            includes = any(True for _ in ast.find_all((jinja2.nodes.Include, jinja2.nodes.Import,
                                                       jinja2.nodes.FromImport,
                                                       jinja2.nodes.Extends)))
            parsed = cache.remember(cache.parsed, source, (
                frozenset(jinja2.meta.find_undeclared_variables(ast)), includes))
        names, includes = parsed
        if includes:
            return self.resolved()  # included files may use any variable
        context: dict[str, Any] = {}
        for name in names:
            if name in self.raw:
                context[name] = self.get(name)
        return context

    def render(self, source: str, label: str = "template") -> str:
        """Render template text.

        Raises:
            ProvisionError: syntax error or undefined variable (named in the message).
        """
        context = self._context_for(source, label)
        try:
            cache = _compiled(self.env)
            template = cache.templates.get(source)
            if template is None:
                template = cache.remember(cache.templates, source, self.env.from_string(source))
            return template.render(context)
        except jinja2.sandbox.SecurityError as exc:
            raise _sandbox_error(self.where, label, exc) from None
        except jinja2.UndefinedError as exc:
            raise undefined_error(self.where, label, exc) from None
        except jinja2.TemplateError as exc:
            raise ProvisionError.single(f"{self.where}: {label}", f"template error: {exc}") \
                from None

    def evaluate(self, expression: str, label: str = "expression") -> Any:
        """Evaluate a Jinja2 expression (``when``, ``changed_when``, ``until``); return its value.

        Raises:
            ProvisionError: syntax error or undefined variable.
        """
        context = self._context_for("{{ " + expression + " }}", label)
        try:
            cache = _compiled(self.env)
            compiled = cache.expressions.get(expression)
            if compiled is None:
                compiled = cache.remember(
                    cache.expressions, expression,
                    self.env.compile_expression(expression, undefined_to_none=False))
            value = compiled(context)
        except jinja2.sandbox.SecurityError as exc:
            raise _sandbox_error(self.where, label, exc) from None
        except jinja2.UndefinedError as exc:
            raise undefined_error(self.where, label, exc) from None
        except jinja2.TemplateError as exc:
            raise ProvisionError.single(f"{self.where}: {label}",
                                        f"invalid expression: {exc}", actual=expression) from None
        if isinstance(value, jinja2.Undefined):
            raise ProvisionError.single(f"{self.where}: {label}", "expression is undefined",
                                        actual=expression)
        return value

    def test(self, expressions: str | list[str] | bool, label: str = "when") -> bool:
        """Return True when every condition is true (a list means all of them, as in Ansible)."""
        if isinstance(expressions, bool):
            return expressions
        items = expressions if isinstance(expressions, list) else [expressions]
        for expression in items:
            if isinstance(expression, bool):
                if not expression:
                    return False
                continue
            text = str(expression).strip()
            if is_template(text) and text.startswith("{{") and text.endswith("}}"):
                text = text[2:-2]
            if not _to_bool(self.evaluate(text, label)):
                return False
        return True


class LazyVars(Mapping[str, Any]):
    """A host's variables seen by a module: a variable is rendered when it is read, never
    before, so an unused value (an unknown inventory variable, a ``-e`` value no task names) is
    never rendered.

    Args:
        templar: the host's :class:`Templar`.

    Reading a variable whose template fails raises that :class:`ProvisionError`.
    """

    def __init__(self, templar: Templar) -> None:
        self._templar = templar

    def __getitem__(self, name: str) -> Any:
        return self._templar.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._templar.raw)

    def __len__(self) -> int:
        return len(self._templar.raw)


def undefined_error(where: str, label: str, exc: jinja2.UndefinedError) -> ProvisionError:
    """Turn a Jinja2 UndefinedError into a ProvisionError naming the variable."""
    return ProvisionError.single(f"{where}: {label}", f"undefined variable: {exc.message}",
                                 fix="define it in the inventory, the role's defaults or with -e")
