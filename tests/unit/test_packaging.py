"""One installed name: the wheel holds ``framespool`` and nothing else at its top level.

The design's top-level folders (``schemas/``, ``processors/``, ...) install as
subpackages of ``framespool`` through ``package-dir``; a folder that is a package
but is missing from ``[tool.setuptools] packages`` would silently not ship.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_installs_one_top_level_name(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("framespool-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"framespool"}
    # the contract's schemas and the dashboard's files ship as package data
    assert any(n.startswith("framespool/schemas/avro/") and n.endswith(".avsc") for n in names)
    assert "framespool/projections/dashboard/index.html" in names


def test_every_source_package_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for name, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found == listed
