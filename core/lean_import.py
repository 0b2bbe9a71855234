"""Importing a library without the optional extras it would pick up only because they are installed.

Some libraries import an optional package at their own import when it is installed, for a feature the bot never
uses: python-telegram-bot imports `cryptography` (about 9 MiB resident; installed for `mcp`'s pyjwt) for Telegram
Passport, structlog imports `rich` (about 4.5 MiB; import-linter's, in development) for a renderer the bot does not
use. Hidden while the library is imported, the library takes the path it takes when the package is missing.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def without(*names: str) -> Iterator[None]:
    """Inside, `import name` fails as if the package were not installed, unless it is imported already; after,
    it imports as usual (a None in sys.modules is Python's documented way to stop an import)."""
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]


# Optional packages python-telegram-bot and httpx import when installed: `cryptography` for Telegram Passport
# (installed for mcp's pyjwt), `click`, `pygments` and `rich` for httpx's command line (click comes with uvicorn).
TELEGRAM_UNUSED = ("cryptography", "click", "pygments", "rich")


def import_telegram() -> None:
    """python-telegram-bot without what the bot never uses from it (about 11 MiB resident): call it before
    anything imports `telegram`. If something did already, this changes nothing."""
    with without(*TELEGRAM_UNUSED):
        import telegram  # noqa: F401


@contextmanager
def inits_deferred(*packages: str) -> Iterator[None]:
    """Inside, importing a submodule of `packages` (parents first) does not run their `__init__`, which may import
    far more than that submodule needs; a package's `__init__` runs the first time something asks it for a name
    it does not have yet, so `from package import Name` still works, later. Packages imported already stay as
    they are. The deferred packages stay in sys.modules after the block: their submodules live in them."""
    for name in packages:
        if name not in sys.modules:
            _defer(name)
    yield


def _defer(name: str) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is no installed package")
    package = importlib.util.module_from_spec(spec)  # __path__ and __spec__ set, its code not run

    def complete(attribute: str) -> Any:
        # Called only for a name the package lacks: run its __init__ once, in place, then answer from it.
        package.__dict__.pop("__getattr__", None)
        loader.exec_module(package)
        try:
            return package.__dict__[attribute]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}") from None

    loader = spec.loader
    package.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)
