"""The one loader of framespool's configuration files (processors, stack, API keys).

Theory of operation
-------------------
1. :func:`read_document` reads a file: ``.toml`` is TOML, anything else JSON; the
   top level must be a table. It returns a :class:`Document`, a dict that
   remembers which file it came from, so an error found later, while the
   document is turned into typed configuration, still names the file.
2. :func:`build` turns a table into a frozen dataclass by the dataclass's own
   type hints (nested dataclasses, tuples, mappings, optionals), refusing
   unknown keys and values of the wrong type.
3. :func:`require` and :func:`optional` read one key of a hand-parsed table
   (the API key table, the stack's settings) with the same checks.

Every :class:`ConfigError` says *which file*, *which key* (a dotted path such
as ``scheduler.tenants[0].weight``) and *what was expected*, so whoever wrote
the file can fix it without reading code.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_MISSING: Any = object()


class ConfigError(ValueError):
    """A configuration file that cannot be read or says something impossible.

    ``file``: the file (None for a table given in code); ``key``: the dotted path
    of the offending key ("" for the file as a whole); ``detail``: what is wrong
    and what was expected."""

    def __init__(self, detail: str, *, key: str = "", file: str | Path | None = None) -> None:
        self.detail = detail
        self.key = key
        self.file = str(file) if file is not None else None
        super().__init__(str(self))

    def __str__(self) -> str:
        where = [f"config file {self.file}"] if self.file else []
        if self.key:
            where.append(self.key)
        return ": ".join([*where, self.detail])

    def in_file(self, file: str | Path | None) -> ConfigError:
        """The same error, naming ``file`` (unless it already names one)."""
        if file is None or self.file is not None:
            return self
        return ConfigError(self.detail, key=self.key, file=file)


class Document(dict):
    """A file's top-level table; ``source`` is the file it was read from."""

    source: str | None = None


def source_of(doc: Mapping[str, Any]) -> str | None:
    return getattr(doc, "source", None)


def read_document(path: str | Path, *, sections: Iterable[str] | None = None) -> Document:
    """The file's top-level table. ``sections``: the only top-level keys allowed."""
    path = Path(path)
    toml = path.suffix == ".toml"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        raw = tomllib.loads(text) if toml else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"not valid {'TOML' if toml else 'JSON'} ({exc}); a .toml file is read as TOML, "
            "anything else as JSON",
            file=path,
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"the top level must be a table/object, got {type(raw).__name__}", file=path
        )
    doc = Document(raw)
    doc.source = str(path)
    if sections is not None:
        allowed = list(sections)
        unknown = sorted(set(doc) - set(allowed))
        if unknown:
            raise ConfigError(
                f"unknown section(s) {unknown}; expected "
                + " and/or ".join(repr(s) for s in allowed),
                file=path,
            )
    return doc


# --------------------------------------------------------------------------
# Hand-parsed tables
# --------------------------------------------------------------------------
def _kind(expected: type | tuple[type, ...]) -> str:
    names = {str: "a string", bool: "true or false", int: "an integer", float: "a number"}
    names.update({list: "a list", dict: "a table/object"})
    kinds = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def optional(
    table: Mapping[str, Any],
    name: str,
    expected: type | tuple[type, ...],
    default: Any,
    *,
    where: str = "",
    file: str | Path | None = None,
) -> Any:
    """``table[name]`` checked against ``expected`` (``default`` when absent or null)."""
    value = table.get(name)
    if value is None:
        return default
    kinds = expected if isinstance(expected, tuple) else (expected,)
    ok = isinstance(value, kinds) or (float in kinds and isinstance(value, int))
    if not ok or (isinstance(value, bool) and bool not in kinds):
        raise ConfigError(
            f"expected {_kind(expected)}, got {value!r}",
            key=f"{where}.{name}" if where else name,
            file=file if file is not None else source_of(table),
        )
    return value


def require(
    table: Mapping[str, Any],
    name: str,
    expected: type | tuple[type, ...],
    *,
    where: str = "",
    file: str | Path | None = None,
) -> Any:
    """``table[name]``, which must be there, checked against ``expected``."""
    value = optional(table, name, expected, _MISSING, where=where, file=file)
    if value is _MISSING:
        raise ConfigError(
            f"missing: expected {_kind(expected)}",
            key=f"{where}.{name}" if where else name,
            file=file if file is not None else source_of(table),
        )
    return value


def table(value: Any, *, key: str, file: str | Path | None = None) -> Mapping[str, Any]:
    """``value`` if it is a table (an empty one for null)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"expected a table/object, got {value!r}", key=key, file=file)
    return value


# --------------------------------------------------------------------------
# Typed configuration: table -> dataclass
# --------------------------------------------------------------------------
def build(cls: type, value: Any, key: str, *, file: str | Path | None = None) -> Any:
    """``value`` (a table) as a ``cls`` dataclass; errors name ``file`` and ``key``."""
    try:
        return _build(cls, value, key)
    except ConfigError as exc:
        raise exc.in_file(file if file is not None else source_of(value)) from None


def _build(cls: type, value: Any, where: str) -> Any:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"expected a table/object of {cls.__name__} fields, got {type(value).__name__}",
            key=where,
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(value) - fields)
    if unknown:
        raise ConfigError(
            f"unknown field(s) {unknown}; {cls.__name__} has: {', '.join(sorted(fields))}",
            key=where,
        )
    kwargs = {name: _coerce(v, hints[name], f"{where}.{name}") for name, v in value.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc), key=where) from None


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner, where)
    if dataclasses.is_dataclass(hint):
        return _build(typing.cast(type, hint), value, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"expected true or false, got {value!r}", key=where)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"expected an integer, got {value!r}", key=where)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"expected a number, got {value!r}", key=where)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"expected a string, got {value!r}", key=where)
        return value
    if origin is tuple:
        return _tuple(value, args, where)
    if origin in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"expected a table/object, got {value!r}", key=where)
        return {
            _coerce(k, args[0], where): _coerce(v, args[1], f"{where}.{k}")
            for k, v in value.items()
        }
    # a new field type: extend me
    raise ConfigError(f"unsupported field type {hint!r}", key=where)


def _tuple(value: Any, args: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    if len(args) == 2 and args[1] is Ellipsis:
        item = args[0]
        # tuple[tuple[str, X], ...] (e.g. retries, user_weights): a table or a list of pairs
        pair = (
            typing.get_origin(item) is tuple
            and len(typing.get_args(item)) == 2
            and typing.get_args(item)[1] is not Ellipsis
        )
        if pair and isinstance(value, Mapping):
            value = list(value.items())
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"expected a list, got {value!r}", key=where)
        return tuple(_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if not isinstance(value, (list, tuple)) or len(value) != len(args):
        raise ConfigError(f"expected a list of {len(args)} values, got {value!r}", key=where)
    return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
