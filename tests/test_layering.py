"""The layers import only inward: core -> adapters/proxy -> recorder -> emitters -> CLI.

Every ``import`` and ``from ... import`` of every module under mcp_token_otel is read with ``ast`` (at module
level and inside functions, relative imports resolved), so a lazy import cannot slip past a rule.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mcp_token_otel

PACKAGE = Path(mcp_token_otel.__file__).parent
# The mcp SDK: the `mcp` distribution, and in mcp 2.x its separate `mcp_types` package.
SDK = ("mcp", "mcp_types")
# Network, process and event-loop modules: the core computes, it never does I/O of its own.
IO_MODULES = (
    "asyncio",
    "socket",
    "ssl",
    "select",
    "selectors",
    "subprocess",
    "multiprocessing",
    "http",
    "urllib.request",  # urllib.parse is computation (percent-decoding), not I/O
    "socketserver",
    "signal",
)
# The core's one third-party import: the optional exact counter (the `exact` extra), pure computation.
CORE_THIRD_PARTY = ("tiktoken", "tiktoken_ext")


@dataclass(frozen=True)
class Import:
    importer: str  # dotted name of the importing module
    target: str  # dotted name of what it imports (for `from m import n`: m and m.n both count)
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.target}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import in ``source`` (the module ``module``), relative ones resolved to absolute names."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.append(Import(module, base, node.lineno))
            found += [Import(module, f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def package_imports() -> list[Import]:
    out: list[Import] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        out += imports_of(path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py")
    return out


def _within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names


IMPORTS = package_imports()


def _violations(importers: tuple[str, ...], forbidden: Callable[[str], bool]) -> list[str]:
    return [str(i) for i in IMPORTS if _within(i.importer, *importers) and forbidden(i.target)]


def test_the_reader_sees_lazy_and_relative_imports() -> None:
    source = "import os\ndef f():\n    from ..recorder import TokenRecorder\n    import mcp.types as t\n"
    targets = {i.target for i in imports_of(source, "mcp_token_otel.emitters.x")}
    assert {"os", "mcp_token_otel.recorder", "mcp_token_otel.recorder.TokenRecorder", "mcp.types"} <= targets
    assert {i.target for i in imports_of("from . import labels", "mcp_token_otel.core", is_package=True)} == {
        "mcp_token_otel.core",
        "mcp_token_otel.core.labels",
    }
    # The package is really read: every layer has modules, and they import things.
    importers = {i.importer for i in IMPORTS}
    for layer in ("core", "core.guard", "adapters", "proxy", "emitters", "cli"):
        assert any(_within(m, f"mcp_token_otel.{layer}") for m in importers), layer


def test_core_imports_only_the_core_and_the_standard_library() -> None:
    def outward(target: str) -> bool:
        if _within(target, "mcp_token_otel"):
            return not _within(target, "mcp_token_otel.core")
        return not (_stdlib(target) or _within(target, *CORE_THIRD_PARTY))

    assert _violations(("mcp_token_otel.core",), outward) == []


def test_core_does_no_io_of_its_own() -> None:
    assert _violations(("mcp_token_otel.core",), lambda t: _within(t, *IO_MODULES)) == []


def test_adapters_import_no_emitter() -> None:
    assert _violations(("mcp_token_otel.adapters",), lambda t: _within(t, "mcp_token_otel.emitters")) == []


def test_emitters_import_no_recorder() -> None:
    assert _violations(("mcp_token_otel.emitters",), lambda t: _within(t, "mcp_token_otel.recorder")) == []


def test_proxy_imports_no_sdk_and_no_adapter() -> None:
    assert _violations(("mcp_token_otel.proxy",), lambda t: _within(t, *SDK, "mcp_token_otel.adapters")) == []


def test_only_adapters_import_the_sdk() -> None:
    # The demo is an application of the SDK (a real server and client to show what gets recorded), not a layer
    # that instruments it.
    allowed = ("mcp_token_otel.adapters", "mcp_token_otel.cli.demo")
    offenders = [str(i) for i in IMPORTS if _within(i.target, *SDK) and not _within(i.importer, *allowed)]
    assert offenders == []
