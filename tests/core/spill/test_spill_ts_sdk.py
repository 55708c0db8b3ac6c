"""The spill's wire shapes as the TypeScript SDK's client reads them (its zod schemas, Node from the test extra):
a cut result with its resource link, every page of a kept result with its ``_meta``, and a refused read."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mcp_token_otel.core.spill import MemorySpillStore, build_spill, link_block, read_spill, spill_uri, with_spill
from tests.helpers.spill_support import source_file
from tests.helpers.support import ROOT, _missing, node_env

pytestmark = pytest.mark.slow

CHECK = """
const t = require("@modelcontextprotocol/sdk/types.js");
const data = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
const cut = t.CallToolResultSchema.parse(data.cut);
const link = cut.content[cut.content.length - 1];
const pages = data.pages.map((p) => t.ReadResourceResultSchema.parse(p));
const error = t.JSONRPCErrorSchema.parse({jsonrpc: "2.0", id: 1, error: data.error}).error;
console.log(JSON.stringify({link, pages, error}));
"""


def test_the_typescript_sdk_reads_the_link_the_pages_and_the_errors(tmp_path: Path) -> None:
    modules = ROOT / ".npm-peers" / "node_modules"
    if not (modules / "@modelcontextprotocol" / "sdk" / "package.json").exists():
        _missing("@modelcontextprotocol/sdk (run scripts/npm-peers)")
    result = {"content": [{"type": "text", "text": source_file(6000)},
                          {"type": "text", "text": json.dumps([{"a": i} for i in range(300)])}]}
    spill = build_spill(result, 2000, tool="read_file")
    store = MemorySpillStore(ttl=300, max_bytes=1 << 26)
    spill_id = store.put("session", spill, 0.0).spill_id
    assert spill_id is not None
    cut = with_spill({"content": [{"type": "text", "text": "shown"}, {"type": "text", "text": "n"}]}, "[notice]",
                     link_block(spill, spill_id))
    pages = [read_spill(store, spill_uri(spill_id, n), "session", 1.0).result for n in range(1, spill.page_count + 1)]
    error = read_spill(store, spill_uri("f" * 32, 1), "session", 1.0).error
    data = tmp_path / "wire.json"
    data.write_text(json.dumps({"cut": cut, "pages": pages, "error": error}))
    script = tmp_path / "check.cjs"
    script.write_text(CHECK)
    env = {**node_env(), "NODE_PATH": str(modules)}
    out = subprocess.run(["node", str(script), str(data)], env=env, capture_output=True, text=True, timeout=60,
                         check=True)
    parsed = json.loads(out.stdout)
    # What the client holds after its schemas parsed them: nothing of ours dropped.
    assert parsed["link"] == cut["content"][-1]
    assert parsed["pages"] == pages
    assert parsed["error"] == error
