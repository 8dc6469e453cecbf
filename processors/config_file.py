"""Processor configuration files: JSON or TOML into the cores' config dataclasses.

One file serves both processors::

    [admission]                      # framespool.processors.core.admission.AdmissionConfig
    cells = ["cell-0", "cell-1"]
    idempotency_horizon_s = 600
    [admission.cell_gpu_types]
    cell-1 = ["H100"]

    [scheduler]                      # framespool.processors.core.CellConfig
    heartbeat_timeout_s = 10
    retries = { node_lost = 5 }
    [[scheduler.tenants]]
    name = "acme"
    weight = 2
    user_weights = { alice = 2.0 }

Field names are the dataclasses' own; a field given replaces its default
entirely (``retries = { node_lost = 5 }`` leaves only that class with a
budget; the others get ``default_retries``). An unknown name or a value of the wrong
type raises :class:`ConfigError` naming the path (``scheduler.tenants[0].weight``)
and what was expected. Admission's ``tiers`` default to the scheduler's tier
names, so the two agree unless told otherwise. Admission no longer rate-limits
(the API's edge limit does, at submit time): an old file's ``admission.rate``
and ``admission.tenant_rates`` are dropped with a warning.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from framespool.processors.core import CellConfig
from framespool.processors.core.admission import AdmissionConfig

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """The configuration file is unreadable or says something impossible; the message says where."""


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The file's top-level table (``.toml`` is TOML, anything else JSON)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        doc = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"config file {path} is not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {exc}"
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path}: the top level must be a table/object")
    unknown = sorted(set(doc) - {"admission", "scheduler"})
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown section(s) {unknown}; "
            "expected 'admission' and/or 'scheduler'"
        )
    return doc


def cell_config(doc: Mapping[str, Any]) -> CellConfig:
    """The ``scheduler`` section as a :class:`CellConfig` (defaults where absent)."""
    return _build(CellConfig, doc.get("scheduler", {}), "scheduler")


def admission_config(doc: Mapping[str, Any]) -> AdmissionConfig:
    """The ``admission`` section as an :class:`AdmissionConfig`."""
    section = dict(doc.get("admission", {}))
    for legacy in ("rate", "tenant_rates"):
        if section.pop(legacy, None) is not None:
            log.warning(
                "admission.%s is ignored: admission no longer rate-limits; "
                "set the API's rate limit instead (it answers 429 at submit time)",
                legacy,
            )
    if "tiers" not in section and "scheduler" in doc:
        section["tiers"] = [t.name for t in cell_config(doc).tiers]
    return _build(AdmissionConfig, section, "admission")


def load_cell_config(path: str | Path) -> CellConfig:
    return cell_config(read_config_file(path))


def load_admission_config(path: str | Path) -> AdmissionConfig:
    return admission_config(read_config_file(path))


# --------------------------------------------------------------------------
# value -> typed value
# --------------------------------------------------------------------------
def _build(cls: type, value: Any, where: str) -> Any:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where}: expected a table/object of {cls.__name__} fields, got {type(value).__name__}"
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(value) - fields)
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {unknown}; {cls.__name__} has: {', '.join(sorted(fields))}"
        )
    kwargs = {name: _coerce(v, hints[name], f"{where}.{name}") for name, v in value.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner, where)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if origin is tuple:
        return _tuple(value, args, where)
    if origin in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table/object, got {value!r}")
        return {
            _coerce(k, args[0], where): _coerce(v, args[1], f"{where}.{k}")
            for k, v in value.items()
        }
    raise ConfigError(f"{where}: unsupported field type {hint!r}")  # a new field type: extend me


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
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if not isinstance(value, (list, tuple)) or len(value) != len(args):
        raise ConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
    return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))


def describe(config: object | None) -> str:
    """A one-line summary for the start-up log."""
    if isinstance(config, AdmissionConfig):
        return f"cells={list(config.cells)} idempotency_horizon_s={config.idempotency_horizon_s:g}"
    if isinstance(config, CellConfig):
        return f"tiers={[t.name for t in config.tiers]} tenants={[t.name for t in config.tenants]}"
    return repr(config)
