"""The dependency rule (pyproject's [tool.importlinter] contracts) holds, and it bites.
(The core's purity is the purity list's: tests/unit/test_purity.py.)

lint-imports finds packages on the file system, and the design's folders
(schemas/, processors/, ...) become ``framespool.*`` only through pyproject's
package-dir, so the check runs over a tree laid out as installed: per-file symlinks
into the checkout (the same layout .ci/checks builds). Because the tree is ours, a
test can add a module to it without touching the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter not installed")


def _link_tree(source: Path, target: Path) -> None:
    for folder, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        here = target / Path(folder).relative_to(source)
        here.mkdir(parents=True, exist_ok=True)
        for name in files:
            if name.endswith(".py"):
                (here / name).symlink_to(Path(folder) / name)


def installed_layout(tmp_path: Path) -> Path:
    """``tmp_path/framespool/...`` as the wheel installs it; returns the tree's root."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    tree = tmp_path / "tree"
    for name, folder in sorted(mapping.items()):  # "framespool" first, then its subpackages
        _link_tree(ROOT / folder, tree.joinpath(*name.split(".")))
    return tree


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=240,
    )


LAYERS = (
    "Layers: composition root > producers > projections, agents, processors > log and "
    "leaves > schemas"
)
NO_TEST_FRAMEWORK = "The installed package imports no test framework"


def verdicts(stdout: str) -> str:
    return " ".join(stdout.split())  # the report wraps long contract names


def test_the_tree_keeps_every_contract(tmp_path):
    result = lint_imports(installed_layout(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{LAYERS} KEPT" in verdicts(result.stdout)
    assert f"{NO_TEST_FRAMEWORK} KEPT" in verdicts(result.stdout)


@pytest.mark.parametrize(
    ("module", "source", "broken"),
    [
        (
            "projections/_reaches_up.py",
            "from framespool.producers import api\n",
            LAYERS,
        ),
        (
            "agents/_wires_itself.py",
            "import framespool.stack\n",
            LAYERS,
        ),
        (
            # a contract suite shipped inside the package (agents/artifact_contract.py was one)
            "agents/_contract.py",
            "import pytest\n",
            NO_TEST_FRAMEWORK,
        ),
        (
            "projections/_strategies.py",
            "from hypothesis import strategies\n",
            NO_TEST_FRAMEWORK,
        ),
    ],
)
def test_a_forbidden_import_breaks_the_rule(tmp_path, module, source, broken):
    tree = installed_layout(tmp_path)
    (tree / "framespool" / module).write_text(source)
    result = lint_imports(tree)
    assert result.returncode != 0
    assert f"{broken} BROKEN" in verdicts(result.stdout), result.stdout
