// The TypeScript SDK's own client (@modelcontextprotocol/sdk) reading a kept result back through the proxy: it
// calls read_file, follows the resource link page by page (each page's _meta names the next), and prints what it
// got as one JSON line. A second client (another conversation: another stdio proxy, another HTTP session) tries
// the same link. Arguments: one JSON object, {path, command, args, env} for stdio or {path, url, headers}.
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = require("@modelcontextprotocol/sdk/client/stdio.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");
const crypto = require("crypto");

const SPILL = "io.github.mcp-token-otel/spill";
const opts = JSON.parse(process.argv[2]);

function transport(headers) {
  if (opts.url) {
    return new StreamableHTTPClientTransport(new URL(opts.url), { requestInit: { headers: headers || {} } });
  }
  return new StdioClientTransport({ command: opts.command, args: opts.args, env: { ...process.env, ...opts.env },
                                    stderr: "inherit" });
}

async function connect(headers) {
  const client = new Client({ name: "ts-spill-reader", version: "1.0.0" });
  await client.connect(transport(headers));
  return client;
}

async function main() {
  const client = await connect(opts.headers);
  const out = { resources: client.getServerCapabilities().resources !== undefined };
  out.listing = (await client.listResources()).resources;
  const result = await client.callTool({ name: "read_file", arguments: { path: opts.path } });
  const link = result.content[result.content.length - 1];
  out.link = link;
  out.notice = result.content[result.content.length - 2].text;
  let uri = link.uri;
  let text = "";
  out.pages = [];
  while (uri) {
    const page = await client.readResource({ uri });
    const meta = page._meta[SPILL];
    out.pages.push({ page: meta.page, pages: meta.pages, tokens: meta.tokens });
    for (const item of page.contents) text += item.text;
    uri = meta.next;
  }
  out.sha256 = crypto.createHash("sha256").update(text, "utf8").digest("hex");
  out.length = Buffer.byteLength(text, "utf8");
  const other = await connect(opts.otherHeaders || opts.headers);
  try {
    await other.readResource({ uri: link.uri });
    out.other = "served";
  } catch (error) {
    out.other = { code: error.code, data: error.data };
  }
  await other.close();
  await client.close();
  console.log(JSON.stringify(out));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
