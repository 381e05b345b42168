"""Load a few real modules of a big package from its unpacked wheel, with the rest of it stubbed.

vLLM and SGLang pull in CUDA kernels, servers and model code at import time. Their
cache code does not need any of that, so the conformance harnesses import the real
cache modules (the files named in ``real``) straight from the unpacked wheel and
hand every other module of the package a *stub*: a module whose every attribute is
an inert placeholder class. Names the real code does call are given real (small)
stand-ins through ``overrides``, so nothing in the code under test is replaced.

Wheels are fetched with ``pip download <pkg>==<version> --no-deps`` into a cache
folder and only their ``.py`` files are unpacked (see ``fetch_wheel``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import types
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CACHE_ENV = "KVLAB_CONFORMANCE_DIR"


def cache_dir() -> Path:
    """Where wheels are downloaded and unpacked: ``$KVLAB_CONFORMANCE_DIR`` or ``~/.cache/kvlab-conformance``."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/kvlab-conformance").expanduser()


def fetch_wheel(package: str, version: str, dest: Path) -> Path:
    """``pip download package==version --no-deps`` into ``cache_dir()/wheels``; unpack its .py files into ``dest``.

    Does nothing when ``dest`` is already unpacked (a ``.complete`` marker is
    written last, so an interrupted unpack is redone).
    """
    marker = dest / ".complete"
    if marker.exists():
        return dest
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps", "-d", str(wheels)],
        check=True,
    )
    found = sorted(wheels.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip download gave no {package} {version} wheel in {wheels}")
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[0]) as wheel:
        wheel.extractall(dest, [n for n in wheel.namelist() if n.endswith(".py")])
    marker.write_text(found[0].name + "\n")
    return dest


class _StubMeta(type):
    """Class-level attribute access on a stub gives another stub (``Stub.X.Y`` works)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(name)

    def __or__(cls, other: Any) -> Any:  # ``Stub | None`` in annotations evaluated at run time
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls


class Stub(metaclass=_StubMeta):
    """An inert stand-in: accepts any arguments, every attribute and call gives another stub."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Stub()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return Stub()

    def __class_getitem__(cls, item: Any) -> Any:
        return cls


def _stub_class(name: str) -> type:
    return _StubMeta(name, (Stub,), {})


class StubModule(types.ModuleType):
    """A module whose missing attributes are created as stub classes on first use."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stub_class(name)
        setattr(self, name, value)
        return value


class SourceLoader(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import hook for one top-level package: real files for ``real``, stubs for the rest.

    ``real`` lists dotted module names loaded from ``root`` (``a.b.c`` from
    ``root/a/b/c.py``). Every other module of the package, parent packages
    included, is a ``StubModule``, so no package ``__init__`` runs.
    ``overrides`` maps a stubbed module's name to attributes to set on it.
    """

    def __init__(
        self,
        package: str,
        root: Path,
        real: Iterable[str],
        overrides: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.package = package
        self.root = Path(root)
        self.real = set(real)
        self.overrides = overrides or {}
        for name in self.real:
            path = self._path(name)
            if not path.exists():
                raise FileNotFoundError(f"{path} is missing: fetch the wheel first (--fetch)")

    def _path(self, name: str) -> Path:
        return self.root.joinpath(*name.split(".")).with_suffix(".py")

    def install(self) -> None:
        """Put the hook first on ``sys.meta_path`` (once) and drop any module of the package already imported."""
        for name in [m for m in sys.modules if m == self.package or m.startswith(self.package + ".")]:
            del sys.modules[name]
        sys.meta_path[:] = [
            f for f in sys.meta_path if not isinstance(f, SourceLoader) or f.package != self.package
        ]
        sys.meta_path.insert(0, self)

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.package and not fullname.startswith(self.package + "."):
            return None
        if fullname in self.real:
            return importlib.util.spec_from_file_location(fullname, self._path(fullname))
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []
        for attr, value in self.overrides.get(spec.name, {}).items():
            setattr(module, attr, value)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass
