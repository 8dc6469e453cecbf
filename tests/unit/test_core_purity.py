"""The scheduling core is a pure function of its inputs: it imports nothing
that does IO, reads a clock, draws randomness or makes ids."""

from __future__ import annotations

import ast
import pathlib

import framespool.processors.core

FORBIDDEN = {
    "faust",
    "confluent_kafka",
    "aiokafka",
    "rocksdict",
    "aiohttp",
    "boto3",
    "asyncio",
    "time",
    "datetime",
    "random",
    "uuid",
    "os",
    "socket",
    "threading",
    "subprocess",
    "secrets",
    "requests",
    "urllib",
    "logging",
}
CORE = pathlib.Path(framespool.processors.core.__file__).parent


def root(name: str) -> str:
    """The distribution-level root of an import; our own packages count by subpackage
    (``framespool.schemas``), since everything installs under ``framespool``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "framespool" else parts[0]


def imported_roots(path: pathlib.Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(root(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(root(node.module))
    return roots


def test_core_modules_import_no_io_clock_or_randomness():
    modules = sorted(CORE.glob("*.py"))
    assert len(modules) >= 8
    for module in modules:
        bad = imported_roots(module) & FORBIDDEN
        assert not bad, f"{module.name} imports {sorted(bad)}"


def test_core_depends_only_on_the_contract_and_itself():
    allowed = {
        "framespool.schemas",
        "framespool.processors",
        "__future__",
        "typing",
        "dataclasses",
        "heapq",
        "statistics",
        "collections",
        "functools",
        "itertools",
        "math",
        "bisect",
        "hashlib",
        "zlib",
        "enum",
        "pickle",
    }
    for module in sorted(CORE.glob("*.py")):
        extra = imported_roots(module) - allowed
        assert not extra, f"{module.name} imports {sorted(extra)}"
