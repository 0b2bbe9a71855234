"""Importing a library without the optional packages it would pick up, and a package's submodules with its
`__init__` deferred: on real packages written to a temporary folder, in a fresh interpreter each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _packages(root: Path) -> None:
    """`lib` imports `extra` when installed; `big`'s __init__ imports `heavy`, its submodule `small` does not."""
    (root / "extra.py").write_text("")
    (root / "heavy.py").write_text("")
    (root / "lib.py").write_text(
        "try:\n    import extra\n    HAS_EXTRA = True\nexcept ImportError:\n    HAS_EXTRA = False\n"
    )
    (root / "big").mkdir()
    (root / "big" / "__init__.py").write_text("import heavy\nfrom big.small import Thing\nNAME = 'big'\n")
    (root / "big" / "small.py").write_text("class Thing:\n    pass\n")


def _run(root: Path, code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", f"import sys\nsys.path.insert(0, {str(root)!r})\n{code}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_without_hides_a_package_only_while_the_library_is_imported(tmp_path: Path) -> None:
    _packages(tmp_path)
    code = (
        "from core.lean_import import without\n"
        "with without('extra'):\n    import lib\n"
        "print(lib.HAS_EXTRA, 'extra' in sys.modules)\n"
        "import extra\n"
        "print('extra' in sys.modules)\n"
    )
    assert _run(tmp_path, code).splitlines() == ["False False", "True"]


def test_without_leaves_a_package_imported_already(tmp_path: Path) -> None:
    _packages(tmp_path)
    code = "import extra\nfrom core.lean_import import without\n"
    code += "with without('extra'):\n    import lib\nprint(lib.HAS_EXTRA)\n"
    assert _run(tmp_path, code) == "True"


def test_a_deferred_init_runs_at_the_first_name_the_package_lacks(tmp_path: Path) -> None:
    _packages(tmp_path)
    code = (
        "from core.lean_import import inits_deferred\n"
        "with inits_deferred('big'):\n    from big.small import Thing\n"
        "print('heavy' in sys.modules)\n"
        "from big import NAME, Thing as Again\n"  # the package's own names: its __init__ runs now, once
        "print('heavy' in sys.modules, NAME, Again is Thing)\n"
        "import big\n"
        "print(big.NAME, '__getattr__' in vars(big))\n"
        "try:\n    big.missing\nexcept AttributeError as exc:\n    print('AttributeError', exc)\n"
    )
    assert _run(tmp_path, code).splitlines() == [
        "False",
        "True big True",
        "big False",
        "AttributeError module 'big' has no attribute 'missing'",
    ]


def test_the_mcp_client_comes_without_the_sdks_server_side() -> None:
    code = (
        "import core.mcp_sdk\n"
        "server = ('starlette', 'uvicorn', 'sse_starlette', 'cryptography', 'mcp.server')\n"
        "print(sorted(m for m in sys.modules if m.startswith(server)))\n"
        "from mcp import ClientSession\n"  # the full package still imports, and is the same code
        "print(ClientSession is core.mcp_sdk.ClientSession)\n"
    )
    assert _run(Path.cwd(), code).splitlines() == ["[]", "True"]
