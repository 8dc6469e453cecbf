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
budget; the others get ``default_retries``). An unknown name or a value of the
wrong type raises :class:`ConfigError` naming the file, the key
(``scheduler.tenants[0].weight``) and what was expected; the loader is
:mod:`framespool.configfile`, shared with the stack's and the API's files.
Admission's ``tiers`` default to the scheduler's tier names, so the two agree
unless told otherwise. Admission no longer rate-limits (the API's edge limit
does, at submit time): an old file's ``admission.rate`` and
``admission.tenant_rates`` are dropped with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from framespool.configfile import ConfigError, Document, build, read_document, source_of
from framespool.processors.core import CellConfig
from framespool.processors.core.admission import AdmissionConfig

log = logging.getLogger(__name__)

__all__ = [
    "ConfigError",
    "admission_config",
    "cell_config",
    "describe",
    "load_admission_config",
    "load_cell_config",
    "read_config_file",
]

SECTIONS = ("admission", "scheduler")


def read_config_file(path: str | Path) -> Document:
    """The file's top-level table (``.toml`` is TOML, anything else JSON), which
    remembers the file so that later errors name it."""
    return read_document(path, sections=SECTIONS)


def cell_config(doc: Mapping[str, Any]) -> CellConfig:
    """The ``scheduler`` section as a :class:`CellConfig` (defaults where absent)."""
    return build(CellConfig, doc.get("scheduler", {}), "scheduler", file=source_of(doc))


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
    return build(AdmissionConfig, section, "admission", file=source_of(doc))


def load_cell_config(path: str | Path) -> CellConfig:
    return cell_config(read_config_file(path))


def load_admission_config(path: str | Path) -> AdmissionConfig:
    return admission_config(read_config_file(path))


def describe(config: object | None) -> str:
    """A one-line summary for the start-up log."""
    if isinstance(config, AdmissionConfig):
        return f"cells={list(config.cells)} idempotency_horizon_s={config.idempotency_horizon_s:g}"
    if isinstance(config, CellConfig):
        return f"tiers={[t.name for t in config.tiers]} tenants={[t.name for t in config.tenants]}"
    return repr(config)


def recorded_document(doc: Mapping[str, Any]) -> tuple[str, str]:
    """(JSON text, its SHA-256) of a config document's sections, as a processor
    records them in the log (``ProcessorConfigured``): keys sorted, so one
    configuration always gives one text."""
    import hashlib
    import json

    text = json.dumps({k: doc[k] for k in sorted(doc)}, sort_keys=True, default=str)
    return text, hashlib.sha256(text.encode()).hexdigest()
