"""The one import package (BRIEF section 7): every folder of the card that holds Python code is a
subpackage of ``elmoe3d`` listed in ``pyproject.toml``, so a non-editable install (a wheel) carries
it. An editable install finds an unlisted subpackage through its parent's folder, so only this
test notices one left out."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _setuptools():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_of(folder: Path, package_dir: dict) -> str | None:
    """The dotted package a folder of the repository is installed as (None: not mapped)."""
    rel = folder.relative_to(REPO).as_posix()
    best = None
    for package, path in package_dir.items():
        if rel == path or rel.startswith(path + "/"):
            if best is None or len(path) > len(package_dir[best]):
                best = package
    if best is None:
        return None
    tail = rel[len(package_dir[best]):].strip("/")
    return best + ("." + tail.replace("/", ".") if tail else "")


def test_every_code_folder_is_a_listed_subpackage():
    cfg = _setuptools()
    package_dir, listed = cfg["package-dir"], set(cfg["packages"])
    found = {}
    for top in package_dir.values():
        for init in sorted((REPO / top).rglob("__init__.py")):
            found[init.parent.relative_to(REPO).as_posix()] = _package_of(init.parent, package_dir)
    assert found, "no package folders found (package-dir mapping changed?)"
    missing = sorted(f"{folder} (as {pkg})" for folder, pkg in found.items() if pkg not in listed)
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks: {', '.join(missing)}"
    # a data package (package-data only, no __init__.py) is listed so setuptools installs it
    data = set(cfg.get("package-data", {}))
    for package in sorted(data):
        folder = REPO / package_dir_folder(package, package_dir)
        assert folder.is_dir() and not (folder / "__init__.py").exists(), \
            f"package-data {package!r}: expected a data folder without __init__.py at {folder}"
        assert package in listed, f"pyproject.toml packages lacks the data package {package}"
    stale = sorted(listed - set(found.values()) - data)
    assert not stale, f"pyproject.toml lists packages with no folder: {', '.join(stale)}"


def package_dir_folder(package: str, package_dir: dict) -> str:
    """The repository folder of a dotted package under the package-dir mapping."""
    parent = max((p for p in package_dir if package == p or package.startswith(p + ".")), key=len)
    tail = package[len(parent):].lstrip(".").replace(".", "/")
    return package_dir[parent] + ("/" + tail if tail else "")


def test_python_folders_have_an_init():
    """A folder of modules without ``__init__.py`` would be left out of a wheel silently."""
    package_dir = _setuptools()["package-dir"]
    bare = []
    for top in package_dir.values():
        for py in (REPO / top).rglob("*.py"):
            if "__pycache__" not in py.parts and not (py.parent / "__init__.py").exists():
                bare.append(py.relative_to(REPO).as_posix())
    assert not bare, f"modules outside any package (no __init__.py beside them): {sorted(bare)}"
