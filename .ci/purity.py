"""The purity checker: every module that says it is pure is on one list, and every
module on the list imports only what cannot do IO, read a clock, draw randomness or
make ids.

The list, and what its modules may import, is ``[tool.framespool.purity]`` in
pyproject.toml; this script is the only check of it (run by ``.ci/checks`` and by
``tests/unit/test_purity.py``). A module *claims* purity when its module docstring
says "pure"; a claimant off the list is an error, so a claim is either checked or
removed. A listed module may import:

- the standard library modules in ``imports`` (none of them does IO when used as
  imported: no ``time``, ``os``, ``random``, ``uuid``, ``datetime``, ``logging``...);
- what ``also`` grants that one module, with the reason beside it in pyproject.toml;
- other listed modules (so purity is transitive: a pure module never reaches an
  impure one through ours).

The check reads imports, lazy ones inside functions included, from the source (a
module's package ``__init__`` is not counted as its import). Usage:
``python .ci/purity.py [ROOT]``; exit 1 with one line per problem.
"""

from __future__ import annotations

import ast
import fnmatch
import pathlib
import sys
import tomllib


def module_files(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every module of the installed name ``framespool``, by dotted name, from the
    design's folders as pyproject's package-dir maps them."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    out: dict[str, pathlib.Path] = {}
    for package, folder in mapping.items():
        base = root / folder
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if any(p in {"__pycache__"} or "-" in p or "." in p for p in parts):
                continue
            name = ".".join([package, *parts])
            if package == "framespool" and parts and f"framespool.{parts[0]}" in mapping:
                continue  # a mapped subpackage wins over a same-named folder
            out.setdefault(name, path)
    return out


def imports_of(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The modules ``name`` imports: ``from X import Y`` counts as ``X.Y`` where that
    is a module of ours, else as ``X``."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return found


def docstring_claims(path: pathlib.Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    return any(word.strip(".,:;()`*\"'").lower() == "pure" for word in doc.split())


def check(root: pathlib.Path) -> list[str]:
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["framespool"]["purity"]
    files = module_files(root)
    known = set(files)
    listed: set[str] = set()
    problems: list[str] = []
    for pattern in config["modules"]:
        hits = {m for m in known if fnmatch.fnmatchcase(m, pattern)}
        if not hits:
            problems.append(f"pyproject purity list: {pattern} names no module")
        listed |= hits
    stdlib = set(config["imports"])
    also = config.get("also", {})
    for module in sorted(listed):
        allowed = stdlib | set(also.get(module, ()))
        for imported in sorted(imports_of(module, files[module], known)):
            if imported in listed or imported.split(".")[0] in allowed or imported in allowed:
                continue
            if (
                imported in known
                and files[imported].name == "__init__.py"
                and _empty(files[imported])
            ):
                continue  # an empty package: a namespace, nothing runs
            problems.append(f"{module} is on the purity list but imports {imported}")
    for module, path in sorted(files.items()):
        if module not in listed and docstring_claims(path):
            problems.append(
                f"{module} says it is pure but is not on the purity list "
                "([tool.framespool.purity] in pyproject.toml): add it, or remove the claim"
            )
    return problems


def _empty(path: pathlib.Path) -> bool:
    tree = ast.parse(path.read_text())
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in tree.body)


def main(argv: list[str]) -> int:
    root = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).parents[1]).resolve()
    problems = check(root)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
