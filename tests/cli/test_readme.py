"""README.md's examples are what the code does: the ``estimate`` output is the command's own (run here), the demo's
table is what the demo's renderer prints for those figures, every command line names real commands and options,
and the wheel's name carries the package version. An example that drifts from the code fails here."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import mcp_token_otel
from mcp_token_otel.cli.demo import SUMMARY_TITLE, TOOL_WEIGHTS, DemoStats, SessionFigures, ToolStats
from mcp_token_otel.cli.main import build_parser
from mcp_token_otel.emitters.aggregate import Aggregate

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks() -> list[list[str]]:
    """The lines of every fenced code block."""
    return [block.splitlines() for block in re.findall(r"^```[a-z]*\n(.*?)^```$", README, flags=re.M | re.S)]


def _block_after(heading: str) -> list[str]:
    """The first code block after the text ``heading``."""
    found = re.search(r"^```[a-z]*\n(.*?)^```$", README[README.index(heading):], flags=re.M | re.S)
    assert found, heading
    return found.group(1).splitlines()


def test_the_estimate_example_is_what_the_command_prints() -> None:
    [block] = [b for b in _blocks() if b and b[0].startswith("$ mcp-token-otel estimate ")]
    args = shlex.split(block[0])[2:]
    out = subprocess.run([sys.executable, "-m", "mcp_token_otel.cli", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == block[1:]


def _stats_from(table: list[str]) -> tuple[DemoStats, SessionFigures]:
    """A DemoStats holding the README table's figures (the rows' counts and percentiles, the tier mix) and the
    session line's."""
    stats = DemoStats(Aggregate())
    _header, *rows, tiers, sessions = table
    for row in rows:
        name, calls, p50, p95, top, _tier, overhead, errors, refused = row.split()
        number = [int(v.replace(",", "")) for v in (p50, p95, top)]
        tool = stats.tools[name] = ToolStats(calls=int(calls), errors=int(errors), refused=int(refused))
        n = tool.calls - tool.refused
        i95 = min(n - 1, int(n * 0.95))  # the renderer's indices: p50 at n // 2, p95 at i95, max last
        tool.tokens.extend([number[0]] * i95 + [number[1]] * (n - 1 - i95) + [number[2]])
        tool.overhead.extend([int(overhead.rstrip("%")) / 100] * n)
    first = next(iter(stats.tools.values()))
    first.tiers.update({tier: int(count) for tier, count in re.findall(r"(\w+) (\d+)", tiers.split(":", 1)[1])})
    found = re.match(r"sessions: (\d+) ended, (\d+) entered warning, (\d+) exhausted, mean utilization at end "
                     r"(\d+)%; ([\d,]+) tokens in no budget$", sessions)
    assert found, sessions
    ended, warning, exhausted, mean, unbudgeted = found.groups()
    return stats, SessionFigures(int(ended), int(warning), int(exhausted), int(mean) / 100 * int(ended),
                                 int(unbudgeted.replace(",", "")))


def test_the_demo_table_is_what_the_demo_prints() -> None:
    title, *table = _block_after("The demo's final table")
    assert title == SUMMARY_TITLE
    rows = table[1:-2]
    assert [row.split()[0] for row in rows] == sorted(TOOL_WEIGHTS)  # every tool the demo's agents call
    # The demo's own renderer, given the README's figures, prints the README's table: header, columns, the
    # tier each p95 falls in, the summary lines.
    stats, sessions = _stats_from(table)
    assert stats.table(sessions).splitlines() == table


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **action.choices}


def _options(line: str) -> list[str]:
    """The long options a command line gives to mcp-token-otel (not those of the server after ``--``)."""
    mine = re.split(r"\s--\s|\s#", f" {line} ")[0]
    return re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", mine)


def test_every_command_line_names_real_commands_and_options() -> None:
    parsers = _subparsers()
    lines = [line for block in _blocks() for line in block if line.startswith("mcp-token-otel ")]
    assert len(lines) > 10
    named = set()
    for line in lines:
        word = line.split()[1]
        command = "" if word.startswith("-") else word
        assert command in parsers, line
        named.add(command)
        known = parsers[command]._option_string_actions
        unknown = [option for option in _options(line) if option not in known]
        assert not unknown, (line, unknown)
    # The command-line section lists every command
    listed = {line.split()[1] for line in _block_after("## The command line")}
    assert listed == (set(parsers) - {""}) | {"--version"}, listed


def test_the_wheel_names_carry_the_version_and_build_is_installed_first() -> None:
    for path in (ROOT / "README.md", ROOT / "docs" / "install.md"):
        versions = set(re.findall(r"mcp_token_otel-([^-\s]+)-py3-none-any\.whl", path.read_text()))
        assert versions - {"<version>"} == {mcp_token_otel.__version__}, (path.name, versions)
    builds = [line for line in README.splitlines() if "python -m build" in line]
    assert builds and all("pip install build &&" in line.split("python -m build")[0] for line in builds), builds
