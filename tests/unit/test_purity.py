"""The one purity checker (.ci/purity.py) over the one list (pyproject.toml's
[tool.framespool.purity]): the tree passes, and each kind of breach is caught."""

from __future__ import annotations

import importlib.util
import pathlib
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("purity", ROOT / ".ci" / "purity.py")
assert _spec and _spec.loader
purity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(purity)


@pytest.mark.slow
def test_every_claimant_is_listed_and_every_listed_module_imports_only_pure_things():
    assert purity.check(ROOT) == []


def test_the_scheduler_core_is_on_the_list_whole():
    import tomllib

    modules = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["framespool"]
    modules = modules["purity"]["modules"]
    assert {"framespool.processors.core", "framespool.processors.core.*"} <= set(modules)


def _tree(tmp_path: pathlib.Path, files: dict[str, str], modules: list[str]) -> pathlib.Path:
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [tool.setuptools.package-dir]
            "framespool" = "pkg"
            "framespool.schemas" = "schemas"
            [tool.framespool.purity]
            modules = {modules!r}
            imports = ["__future__", "math", "dataclasses"]
            [tool.framespool.purity.also]
            "framespool.granted" = ["random"]
            """
        )
    )
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_each_breach_is_reported(tmp_path):
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/good.py": '"""Pure."""\nimport math\nfrom framespool.schemas import events\n',
            "schemas/__init__.py": '"""The contract."""\n',
            "schemas/events.py": "from dataclasses import dataclass\n",
            "pkg/clock.py": '"""Pure, it says."""\nimport time\n',
            "pkg/lazy.py": "def f():\n    import uuid\n    return uuid.uuid4()\n",
            "pkg/reach.py": "from . import impure\n",
            "pkg/impure.py": "import os\n",
            "pkg/claimer.py": '"""A pure function of its inputs."""\n',
            "pkg/granted.py": "import random\n",
            "pkg/shell.py": '"""Does IO: the shell around the pure core."""\nimport os\n',
        },
        [
            "framespool.good",
            "framespool.schemas.events",
            "framespool.clock",
            "framespool.lazy",
            "framespool.reach",
            "framespool.granted",
            "framespool.missing",
        ],
    )
    problems = purity.check(root)
    assert sorted(problems) == sorted(
        [
            "pyproject purity list: framespool.missing names no module",
            "framespool.clock is on the purity list but imports time",
            "framespool.lazy is on the purity list but imports uuid",
            "framespool.reach is on the purity list but imports framespool.impure",
            "framespool.claimer says it is pure but is not on the purity list "
            "([tool.framespool.purity] in pyproject.toml): add it, or remove the claim",
            "framespool.shell says it is pure but is not on the purity list "
            "([tool.framespool.purity] in pyproject.toml): add it, or remove the claim",
        ]
    )


def test_the_core_reaching_the_log_breaks_purity(tmp_path):
    """What the import-linter contract on the core caught, the list catches: a core
    module importing the log adapter (impure, off the list)."""
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core/__init__.py": "",
            "pkg/core/cell.py": "from framespool.log import LogProducer\n",
            "pkg/log/__init__.py": "from .kafka import LogProducer\n",
            "pkg/log/kafka.py": "import socket\nLogProducer = object\n",
        },
        ["framespool.core", "framespool.core.*"],
    )
    assert purity.check(root) == [
        "framespool.core.cell is on the purity list but imports framespool.log"
    ]
