"""Test modules import helpers from ``tests/support/``, never from each other: a helper
that lives in a test module is found by nobody, and importing a test module runs its
collection-time code (hypothesis strategies, fixtures) a second time under another name.
Checked by an AST scan of every import, at any depth, under ``tests/``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def offenders(root: Path) -> list[str]:
    """``path:line: module`` for each import under ``root/tests`` of a ``tests.*`` module
    outside ``tests.support``, or of a test module or conftest by its bare name (pytest's
    rootdir insertion makes ``import test_x`` work for a folder without ``__init__.py``)."""
    tests = root / "tests"
    local = {p.stem for p in tests.rglob("*.py") if p.stem.startswith("test_")} | {"conftest"}
    found = []
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(root)
        package = rel.with_suffix("").parts[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    module = ".".join([*base, *([module] if module else [])])
                # `from tests.unit import test_x` names the module in the alias
                targets = [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                if parts[0] == "tests":
                    bad = parts[1:2] != ["support"]
                else:
                    bad = parts[0] in local
                if bad:
                    found.append((str(rel), node.lineno, target))
    return [f"{rel}:{line}: {target}" for rel, line, target in sorted(found)]


def test_no_test_module_imports_another():
    assert offenders(ROOT) == []


def test_the_scan_finds_every_way_of_importing_a_test_module(tmp_path):
    files = {
        "tests/__init__.py": "",
        "tests/conftest.py": "",
        "tests/support/__init__.py": "",
        "tests/support/core.py": "def of(): ...\n",
        "tests/unit/test_a.py": "def helper(): ...\n",
        "tests/unit/test_b.py": (
            "from aiohttp.test_utils import TestClient\n"  # not ours: allowed
            "from tests.support.core import of\n"  # allowed
            "from tests import support\n"  # allowed
            "from tests.unit.test_a import helper\n"  # 4
            "from tests.unit import test_a\n"  # 5
            "import tests.unit.test_a\n"  # 6
            "def test_x():\n"
            "    from test_a import helper\n"  # 8: bare name, inside a function
            "from tests.conftest import fixture\n"  # 9
        ),
        "tests/integration/__init__.py": "",
        "tests/integration/helpers.py": "",
        "tests/integration/test_c.py": (
            "from . import helpers\n"  # 1: a helper beside the tests, not in support
            "from .test_d import thing\n"  # 2
            "from ..unit import test_a\n"  # 3
        ),
        "tests/integration/test_d.py": "thing = 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert offenders(tmp_path) == [
        "tests/integration/test_c.py:1: tests.integration.helpers",
        "tests/integration/test_c.py:2: tests.integration.test_d.thing",
        "tests/integration/test_c.py:3: tests.unit.test_a",
        "tests/unit/test_b.py:4: tests.unit.test_a.helper",
        "tests/unit/test_b.py:5: tests.unit.test_a",
        "tests/unit/test_b.py:6: tests.unit.test_a",
        "tests/unit/test_b.py:8: test_a.helper",
        "tests/unit/test_b.py:9: tests.conftest.fixture",
    ]
