"""The installed MCP SDK's own test suite, run without and with the shim: the failures the shim adds.

    .venv/bin/python benchmarks/sdk_suite.py                      # mcp 2.x in .venv
    .venv-mcp1/bin/python benchmarks/sdk_suite.py --venv .venv-mcp1

Gets the sdist of the installed ``mcp`` version from PyPI (its ``tests/`` are in it), makes a throwaway venv that
sees the project venv's packages and adds the suite's test dependencies, then runs the suite twice on the
installed SDK: plainly, and with this module loaded as a pytest plugin (``-p sdk_suite``), which calls
``mcp_token_otel.instrument()`` before the first test. Prints the tests run, the failures of each run and the
failures only the instrumented run has. Exit status 1 when there are any. Not part of the test suite (minutes).
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Dev-group entries that are not test dependencies (linters, the type checker).
NOT_TEST_DEPS = {"pyright", "ruff"}
#: The file the plugin names each instrumented process in.
PROOF = "SDK_SUITE_INSTRUMENTED"


def pytest_configure(config: Any) -> None:
    """As a pytest plugin: instrument the SDK before any test runs, as an application would at start-up."""
    import mcp_token_otel

    if mcp_token_otel.instrument() is None:
        raise RuntimeError("mcp_token_otel.instrument() could not hook the installed SDK")
    proof = os.environ.get(PROOF)
    if proof:  # one line per instrumented process (the controller and each xdist worker)
        with open(proof, "a") as out:
            out.write(f"{os.getpid()}\n")


def pytest_report_header(config: Any) -> str:
    return "mcp_token_otel: instrumented"


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kwargs)


def _sdist(python: str, version: str, work: Path) -> Path:
    """The extracted sdist of mcp ``version`` (downloaded once into ``work``)."""
    tree = work / f"mcp-{version}"
    if not (tree / "tests").is_dir():
        _run([python, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps", f"mcp=={version}",
              "-d", str(work)])
        with tarfile.open(work / f"mcp-{version}.tar.gz") as archive:
            archive.extractall(work, filter="data")
    if not (tree / "tests").is_dir():
        raise SystemExit(f"the sdist of mcp {version} has no tests/")
    return tree


def _test_deps(tree: Path, version: str) -> list[str]:
    """The suite's dev dependencies and the SDK's extras, without linters and the SDK's own workspace or
    git-sourced packages."""
    if sys.version_info < (3, 11):
        raise SystemExit("reading the sdist's pyproject.toml needs Python 3.11 or newer (tomllib)")
    tomllib = importlib.import_module("tomllib")  # the project's type checks target 3.10
    project = tomllib.loads((tree / "pyproject.toml").read_text())
    local = {name for name in project.get("tool", {}).get("uv", {}).get("sources", {}) if name != "mcp"}
    deps = project.get("dependency-groups", {}).get("dev", [])
    names = [(d, d.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip()) for d in deps]
    extras = ",".join(project.get("project", {}).get("optional-dependencies", {}))
    # The SDK's extras (cli, ws, ...) too, as its CI installs them: satisfied by the installed mcp's version.
    own = [f"mcp[{extras}]=={version}"] if extras else []
    return own + [d for d, name in names if isinstance(d, str) and name not in NOT_TEST_DEPS | local]


def _test_venv(python: str, version: str, tree: Path, work: Path) -> Path:
    """A venv that sees the project venv's site-packages (the SDK and the shim as installed, its own .pth files
    processed) and has the suite's test dependencies on top; the project venv is never changed."""
    venv = work / "venv"
    if not (venv / "bin" / "python").exists():
        base = _run([python, "-c", "import sys; print(sys.base_prefix)"]).stdout.strip()
        _run([str(Path(base) / "bin" / "python3"), "-m", "venv", str(venv)])
    new = str(venv / "bin" / "python")
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    own = _run([new, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(own, "project-venv.pth").write_text(f"import site; site.addsitedir({purelib!r})\n")
    _run([new, "-m", "pip", "install", "-q", "--disable-pip-version-check", *_test_deps(tree, version)])
    return venv


def _failures(junit: Path) -> tuple[int, set[str]]:
    """(tests run, the ids of the tests that failed or errored) from a JUnit XML report."""
    tests, failed = 0, set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        tests += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(f"{case.get('classname')}::{case.get('name')}")
    return tests, failed


def _suite(venv: Path, tree: Path, shim: bool, args: argparse.Namespace) -> tuple[int, set[str]]:
    junit = tree / f"junit-{'shim' if shim else 'plain'}.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MCP_TOKEN_OTEL_"))}
    # The suite's examples package is a workspace member: on the path as its editable install would put it.
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "examples"), str(HERE)])
    cmd = [str(venv / "bin" / "python"), "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider",
           "--color=no", "-o", "log_cli=false", f"--junitxml={junit}", "-n", str(args.workers)]
    proof = tree / "instrumented.txt"
    proof.unlink(missing_ok=True)
    junit.unlink(missing_ok=True)
    if shim:
        cmd += ["-p", "sdk_suite"]
        env[PROOF] = str(proof)
    done = subprocess.run([*cmd, *args.pytest_args], cwd=tree, env=env, text=True, capture_output=True,
                          timeout=args.timeout)
    if not junit.exists():
        raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
    tests, failed = _failures(junit)
    print(f"  {'with' if shim else 'without'} the shim: {tests} tests, {len(failed)} failed or errored "
          f"(pytest exit status {done.returncode})", flush=True)
    if shim:
        processes = len(proof.read_text().split()) if proof.exists() else 0
        print(f"  instrumented in {processes} pytest processes")
        if not processes:
            raise SystemExit("the plugin did not instrument any pytest process")
    return tests, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv", help="the venv whose mcp is tested")
    parser.add_argument("--work", type=Path, help="where the sdist and the test venv go (kept; default: temp)")
    parser.add_argument("--workers", default="2", help="pytest-xdist workers per run (default 2)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per suite run")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    python = str(args.venv.resolve() / "bin" / "python")
    version = _run([python, "-c", "import importlib.metadata as m; print(m.version('mcp'))"]).stdout.strip()
    work = args.work.resolve() if args.work else Path(tempfile.mkdtemp(prefix=f"sdk-suite-{version}-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"mcp {version}: suite from its sdist in {work}", flush=True)
    tree = _sdist(python, version, work)
    venv = _test_venv(python, version, tree, work)
    tests, plain = _suite(venv, tree, False, args)
    tests_on, shimmed = _suite(venv, tree, True, args)
    new = sorted(shimmed - plain)
    print(f"mcp {version}: {tests} tests ({tests_on} with the shim); failures without the shim {len(plain)}, "
          f"with it {len(shimmed)}; new with the shim: {len(new)}")
    for name in new:
        print(f"  new: {name}")
    for name in sorted(plain - shimmed):
        print(f"  failed only without the shim: {name}")
    for name in sorted(plain & shimmed):
        print(f"  failed in both runs: {name}")
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
