"""Deterministic, offline corpus for the token-estimator benchmark and fit.

Every sample has a content *kind* (prose, JSON, MCP envelopes, code, CJK, ...) and a
*split*: ``"train"`` samples are used by ``fit_estimator.py``, ``"test"`` samples are
held out (other seeds, other files) and only used to report accuracy.

Real files are used where the machine has them (Python stdlib sources, READMEs and
licences in site-packages, TypeScript under node_modules, CJK texts from the stdlib test
suite, log files, HTML shipped by packages, translated man pages); everything else is
generated from seeded ``random`` so the corpus is the same from run to run on a given
machine. Nothing is downloaded. Train and test never share a file.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

KINDS: tuple[str, ...] = (
    "prose",
    "json_pretty",
    "json_compact",
    "mcp_envelope",
    "python",
    "typescript",
    "paths_urls",
    "cjk",
    "base64",
    "markdown_table",
    "logs",
    "multilingual",  # extra kind (not a target): keeps the non-ASCII weights honest
    # Real text only (no generator): the kinds the estimator misses most.
    "app_logs",  # log files on this machine: /var/log, npm debug logs, logs shipped in /usr/share/doc
    "html",  # HTML shipped by packages: /usr/share/doc, npm's docs, site-packages
    "other_languages",  # translated man pages (/usr/share/man/<lang>), rendered to text by groff
)

MIN_SIZE = 100
MAX_SIZE = 50_000


@dataclass(frozen=True)
class Sample:
    kind: str
    split: str  # "train" or "test"
    source: str  # file path or generator seed, for debugging
    text: str


# --------------------------------------------------------------------------- helpers

WORDS = [
    "user",
    "id",
    "name",
    "value",
    "status",
    "error",
    "result",
    "request",
    "response",
    "token",
    "count",
    "context",
    "tool",
    "call",
    "server",
    "client",
    "session",
    "message",
    "content",
    "type",
    "text",
    "image",
    "data",
    "file",
    "path",
    "config",
    "option",
    "cache",
    "index",
    "query",
    "filter",
    "limit",
    "offset",
    "page",
    "size",
    "total",
    "items",
    "list",
    "item",
    "field",
    "record",
    "table",
    "column",
    "row",
    "schema",
    "model",
    "budget",
    "span",
    "metric",
    "trace",
    "event",
    "level",
    "source",
    "target",
    "created",
    "updated",
    "deleted",
    "enabled",
    "timeout",
    "retry",
    "handler",
    "callback",
    "promise",
    "stream",
    "buffer",
    "input",
    "output",
    "params",
    "args",
    "kwargs",
    "key",
    "values",
    "entry",
    "node",
    "tree",
    "graph",
    "edge",
    "weight",
    "score",
    "account",
    "project",
    "repository",
    "branch",
    "commit",
    "author",
    "email",
    "address",
    "city",
    "country",
    "region",
    "order",
    "invoice",
    "payment",
    "amount",
    "currency",
    "price",
    "product",
    "customer",
    "vendor",
    "shipping",
    "description",
    "title",
    "summary",
    "label",
    "tag",
    "category",
    "version",
    "release",
    "build",
    "deploy",
    "cluster",
    "pod",
    "container",
    "image",
    "registry",
    "secret",
    "volume",
    "network",
    "policy",
    "role",
    "permission",
    "scope",
    "start",
    "end",
    "duration",
    "latency",
    "bytes",
    "chunk",
    "batch",
    "worker",
    "queue",
    "job",
    "task",
    "state",
    "done",
]

TLDS = ("com", "org", "io", "dev", "net", "ai", "co.uk")


def _size(rng: random.Random) -> int:
    """Log-uniform target size between ~100 B and ~50 KB."""
    return int(10 ** rng.uniform(2.0, 4.7))


def _ident(rng: random.Random, style: str = "camel") -> str:
    parts = [rng.choice(WORDS) for _ in range(rng.randint(1, 3))]
    if style == "snake":
        return "_".join(parts)
    if style == "pascal":
        return "".join(p.capitalize() for p in parts)
    return parts[0] + "".join(p.capitalize() for p in parts[1:])


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
    return " ".join(words).capitalize() + rng.choice((".", ".", ".", "?", "!"))


def _scalar(rng: random.Random, depth: int = 0) -> object:
    r = rng.random()
    if r < 0.30:
        return _sentence(rng) if rng.random() < 0.3 else _ident(rng, rng.choice(("camel", "snake")))
    if r < 0.50:
        return rng.randint(0, 10 ** rng.randint(1, 9))
    if r < 0.60:
        return round(rng.uniform(-1000, 1000), rng.randint(1, 6))
    if r < 0.68:
        return rng.choice((True, False, None))
    if r < 0.76:
        return (
            f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
            f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"
        )
    if r < 0.82:
        a, b, c, d, e = (rng.getrandbits(n) for n in (32, 16, 16, 16, 48))
        return f"{a:08x}-{b:04x}-{c:04x}-{d:04x}-{e:012x}"
    if r < 0.88:
        return _url(rng)
    if depth < 3:
        return _obj(rng, depth + 1)
    return _ident(rng)


def _obj(rng: random.Random, depth: int = 0) -> object:
    if rng.random() < 0.3:
        return [_scalar(rng, depth + 1) for _ in range(rng.randint(1, 5))]
    return {
        _ident(rng, rng.choice(("camel", "snake"))): _scalar(rng, depth) for _ in range(rng.randint(2, 7))
    }


def _records(rng: random.Random, size: int) -> list[object]:
    """A list of JSON records whose serialisation is roughly `size` chars."""
    keys = [_ident(rng, rng.choice(("camel", "snake"))) for _ in range(rng.randint(3, 8))]
    out: list[object] = []
    total = 0
    while total < size:
        rec = {k: _scalar(rng, 2) for k in keys}
        out.append(rec)
        total += len(json.dumps(rec))
    return out


def _url(rng: random.Random) -> str:
    host = f"{rng.choice(WORDS)}{rng.choice(('', '-api', '.internal', 's'))}.{rng.choice(TLDS)}"
    path = "/".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))
    url = f"https://{host}/{path}"
    if rng.random() < 0.5:
        url += "?" + "&".join(f"{rng.choice(WORDS)}={rng.randint(0, 9999)}" for _ in range(rng.randint(1, 3)))
    return url


def _path(rng: random.Random) -> str:
    root = rng.choice(("/usr/lib/", "/home/dev/", "/var/log/", "C:\\Users\\dev\\", "./src/", "~/.config/"))
    sep = "\\" if root.startswith("C:") else "/"
    parts = [_ident(rng, rng.choice(("snake", "camel", "pascal"))) for _ in range(rng.randint(1, 5))]
    ext = rng.choice((".py", ".ts", ".json", ".log", ".md", ".tar.gz", ".yaml", ""))
    return root + sep.join(parts) + ext


def _trim(text: str, size: int) -> str:
    """Cut at the last line break before `size` when there is one (keeps samples natural)."""
    if len(text) <= size:
        return text
    cut = text.rfind("\n", 0, size)
    return text[: cut if cut > size // 2 else size]


# --------------------------------------------------------------------------- generators


def gen_json(rng: random.Random, pretty: bool) -> str:
    size = _size(rng)
    ascii_only = rng.random() < 0.5

    def dump(obj: object) -> str:
        return json.dumps(obj, indent=2 if pretty else None, ensure_ascii=ascii_only)

    payload: object = _records(rng, size // 2) if rng.random() < 0.6 else _obj(rng)
    while len(dump(payload)) < size * 0.7:  # nested objects can come out small
        payload = {"items": payload, **{_ident(rng): _scalar(rng, 1) for _ in range(3)}}
    return dump(payload)


def gen_mcp_envelope(rng: random.Random) -> str:
    """A JSON-RPC `tools/call` result as an MCP server returns it."""
    size = _size(rng)
    data = _records(rng, max(40, size // 2))
    blocks: list[dict[str, object]] = []
    style = rng.random()
    if style < 0.4:  # JSON serialised into a text block (the common case)
        blocks.append({"type": "text", "text": json.dumps(data, indent=rng.choice((None, 2)))})
    elif style < 0.7:
        body = "\n".join(_sentence(rng) for _ in range(max(1, size // 90)))
        blocks.append({"type": "text", "text": body})
    else:
        blocks.append({"type": "text", "text": _sentence(rng)})
        raw = rng.randbytes(max(30, size // 3))
        mime = rng.choice(("image/png", "image/jpeg", "application/pdf"))
        if mime.startswith("image"):
            blocks.append({"type": "image", "data": base64.b64encode(raw).decode(), "mimeType": mime})
        else:
            blocks.append(
                {
                    "type": "resource",
                    "resource": {
                        "uri": f"file:///{_path(rng).lstrip('/~.')}",
                        "mimeType": mime,
                        "blob": base64.b64encode(raw).decode(),
                    },
                }
            )
    result: dict[str, object] = {"content": blocks, "isError": rng.random() < 0.1}
    if rng.random() < 0.6:
        result["structuredContent"] = {"items": data[: max(1, len(data) // 2)], "total": len(data)}
    if rng.random() < 0.5:
        result["_meta"] = {
            "progressToken": rng.randint(1, 9999),
            "traceparent": f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01",
        }
    env = {"jsonrpc": "2.0", "id": rng.randint(1, 99999), "result": result}
    return json.dumps(env, indent=rng.choice((None, None, 2)))


def gen_typescript(rng: random.Random) -> str:
    size = _size(rng)
    out = [f"import {{ {_ident(rng, 'pascal')}, {_ident(rng)} }} from './{_ident(rng)}';\n"]
    while sum(map(len, out)) < size:
        r = rng.random()
        name = _ident(rng, "pascal")
        if r < 0.3:
            fields = "\n".join(
                f"  {_ident(rng)}{rng.choice(('', '?'))}: "
                f"{rng.choice(('string', 'number', 'boolean', 'string[]', 'Date', _ident(rng, 'pascal')))};"
                for _ in range(rng.randint(2, 8))
            )
            out.append(f"export interface {name} {{\n{fields}\n}}\n")
        elif r < 0.6:
            arg, ret = _ident(rng), _ident(rng, "pascal")
            body = "\n".join(
                f"  const {_ident(rng)} = await this.{_ident(rng)}("
                f"{arg}.{_ident(rng)}, {rng.randint(0, 500)});"
                for _ in range(rng.randint(1, 6))
            )
            out.append(
                f"export async function {_ident(rng)}({arg}: {name}): Promise<{ret} | undefined> {{\n"
                f"{body}\n  if (!{arg}) {{\n    throw new Error(`{_sentence(rng)} ${{{arg}.id}}`);\n  }}\n"
                f"  return {{ ...{arg}, {_ident(rng)}: {rng.choice(('true', 'null', '[]', '0'))} }};\n}}\n"
            )
        elif r < 0.85:
            members = "\n".join(
                f"  {rng.choice(('private', 'public', 'protected readonly'))} {_ident(rng)}: "
                f"Map<string, {_ident(rng, 'pascal')}> = new Map();"
                for _ in range(rng.randint(1, 4))
            )
            out.append(
                f"export class {name}<T extends {_ident(rng, 'pascal')}> "
                f"implements {_ident(rng, 'pascal')} {{\n"
                f"{members}\n\n  constructor(private readonly {_ident(rng)}: T) {{}}\n\n"
                f"  /** {_sentence(rng)} */\n  {_ident(rng)}(): T[] {{\n"
                f"    return [...this.{_ident(rng)}.values()].filter((x) => x.{_ident(rng)} > "
                f"{rng.randint(0, 99)});\n  }}\n}}\n"
            )
        else:
            opts = " | ".join(f"'{_ident(rng, 'snake')}'" for _ in range(rng.randint(2, 5)))
            out.append(f"export type {name} = {opts};\n// {_sentence(rng)}\n")
    return _trim("\n".join(out), size)


def gen_paths_urls(rng: random.Random) -> str:
    size = _size(rng)
    lines: list[str] = []
    while sum(map(len, lines)) < size:
        lines.append(_url(rng) if rng.random() < 0.5 else _path(rng))
    return "\n".join(lines)


def gen_base64(rng: random.Random) -> str:
    raw = rng.randbytes(int(_size(rng) * 0.75))
    text = base64.b64encode(raw).decode()
    if rng.random() < 0.3:  # MIME-style line wrapping
        text = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    return text


def gen_markdown_table(rng: random.Random) -> str:
    size = _size(rng)
    cols = [_ident(rng, rng.choice(("snake", "pascal"))) for _ in range(rng.randint(2, 7))]
    kinds = [rng.choice(("word", "int", "float", "status", "sentence", "code")) for _ in cols]

    def cell(k: str) -> str:
        if k == "int":
            return str(rng.randint(0, 10 ** rng.randint(1, 7)))
        if k == "float":
            return f"{rng.uniform(0, 100):.{rng.randint(1, 3)}f}"
        if k == "status":
            return rng.choice(("✅ ok", "❌ failed", "pending", "**done**", "n/a"))
        if k == "sentence":
            return _sentence(rng)
        if k == "code":
            return f"`{_ident(rng, 'snake')}()`"
        return _ident(rng, "pascal")

    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    while sum(map(len, lines)) < size:
        lines.append("| " + " | ".join(cell(k) for k in kinds) + " |")
    return "\n".join(lines)


def gen_logs(rng: random.Random) -> str:
    size = _size(rng)
    lines: list[str] = []
    levels = ("INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
    while sum(map(len, lines)) < size:
        ts = (
            f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
            f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}Z"
        )
        r = rng.random()
        if r < 0.4:
            msg = (
                f"{_sentence(rng)} {_ident(rng, 'snake')}={rng.randint(0, 99999)} "
                f"duration_ms={rng.uniform(0, 900):.2f}"
            )
        elif r < 0.6:
            msg = (
                f"{rng.choice(('GET', 'POST', 'PUT'))} {_url(rng)} {rng.choice((200, 201, 404, 500))} "
                f'{rng.randint(100, 99999)}b "{rng.choice(("curl/8.1", "python-httpx/0.27", "Mozilla/5.0"))}"'
            )
        elif r < 0.8:
            msg = json.dumps(
                {
                    "event": _ident(rng, "snake"),
                    "trace_id": f"{rng.getrandbits(128):032x}",
                    "user": _ident(rng),
                    "ok": rng.random() < 0.8,
                }
            )
        else:
            msg = (
                f'Traceback (most recent call last):\n  File "{_path(rng)}", line {rng.randint(1, 900)}, '
                f"in {_ident(rng, 'snake')}\n{_ident(rng, 'pascal')}Error: {_sentence(rng)}"
            )
        lines.append(
            f"{ts} {rng.choice(levels):5} [{_ident(rng, 'snake')}] pid={rng.randint(100, 65535)} {msg}"
        )
    return _trim("\n".join(lines), size)


# Hand-written CJK sentences (technical and everyday register) for generated CJK samples.
CJK_SENTENCES = (
    # Chinese
    "这个工具会统计每次调用返回的令牌数量，并把结果写入监控系统。",
    "如果上下文窗口已经接近上限，模型可能会忽略较早的消息。",
    "我们建议在生产环境中开启采样，以降低性能开销。",
    "服务器返回的数据包含用户名、订单编号和创建时间等字段。",
    "请检查配置文件中的端口号是否与防火墙规则一致。",
    "今天北京天气晴朗，最高气温二十六度，适合户外活动。",
    "该函数在输入为空时返回零，否则返回估算的结果。",
    "数据库连接池的大小应根据并发请求的数量进行调整。",
    "错误信息显示文件不存在，请确认路径是否正确。",
    "新版本修复了内存泄漏问题，并提升了查询速度。",
    # Japanese
    "このツールは各呼び出しで返されるトークン数を計測します。",
    "設定ファイルを更新した後、サーバーを再起動してください。",
    "ユーザーの検索結果は最大百件まで表示されます。",
    "東京の今日の天気は曇りのち雨で、夕方から風が強くなるでしょう。",
    "エラーが発生した場合は、ログを確認してから再試行してください。",
    "この関数は文字列を受け取り、推定されたトークン数を返します。",
    "データベースへの接続がタイムアウトしました。",
    "新しい機能は来月のリリースで利用可能になる予定です。",
    # Korean
    "이 도구는 각 호출에서 반환되는 토큰 수를 측정합니다.",
    "설정 파일을 수정한 후 서버를 다시 시작하세요.",
    "검색 결과는 최대 백 개까지 표시됩니다.",
    "오늘 서울의 날씨는 맑고 최고 기온은 이십칠 도입니다.",
    "오류가 발생하면 로그를 확인한 후 다시 시도하십시오.",
    "이 함수는 문자열을 입력받아 예상 토큰 수를 반환합니다.",
    "데이터베이스 연결 시간이 초과되었습니다.",
)


def gen_cjk(rng: random.Random) -> str:
    size = _size(rng)
    # Mostly one language per sample, with some ASCII terms mixed in like real docs.
    lang = rng.choice(((0, 10), (10, 18), (18, 25), (0, 25)))
    pool = CJK_SENTENCES[lang[0] : lang[1]]
    out: list[str] = []
    while sum(len(s.encode()) for s in out) < size:
        s = rng.choice(pool)
        if rng.random() < 0.15:
            s = s + f" ({_ident(rng)}={rng.randint(0, 999)})"
        out.append(s + ("\n" if rng.random() < 0.2 else ""))
    return "".join(out)


MULTILINGUAL_SENTENCES = (
    "Le serveur a renvoyé une erreur inattendue lors de la création du fichier.",
    "Veuillez vérifier les paramètres de connexion avant de réessayer.",
    "Die Anfrage wurde erfolgreich verarbeitet, aber einige Felder fehlen noch.",
    "Größere Dateien werden in mehreren Blöcken übertragen.",
    "La función devuelve el número estimado de tokens para cada mensaje.",
    "¿Está seguro de que desea eliminar todos los registros?",
    "O usuário não tem permissão para acessar este recurso.",
    "Сервер вернул ошибку при обработке запроса пользователя.",
    "Пожалуйста, проверьте настройки подключения и повторите попытку.",
    "Η διαδικασία ολοκληρώθηκε με επιτυχία σε τρία δευτερόλεπτα.",
    "تم حفظ الملف بنجاح في المجلد المحدد.",
    "सर्वर ने अनुरोध को सफलतापूर्वक संसाधित किया।",
    "Máy chủ đã trả về lỗi khi xử lý yêu cầu của người dùng.",
    "Deploy finished 🚀 all checks passed ✅ — 3 warnings ⚠️ remain.",
    "Great job 🎉🎉 thanks everyone 🙏 see you tomorrow 😀👋",
    "Kullanıcı oturumu zaman aşımına uğradı, lütfen tekrar giriş yapın.",
    "Użytkownik nie ma uprawnień do tego zasobu.",
)


def gen_multilingual(rng: random.Random) -> str:
    size = _size(rng)
    lang = rng.randrange(len(MULTILINGUAL_SENTENCES) // 2)
    pool = MULTILINGUAL_SENTENCES[2 * lang : 2 * lang + 2] if rng.random() < 0.7 else MULTILINGUAL_SENTENCES
    out: list[str] = []
    while sum(len(s.encode()) for s in out) < size:
        out.append(rng.choice(pool) + rng.choice((" ", " ", "\n")))
    return "".join(out)


def gen_prose(rng: random.Random) -> str:
    """Fallback only, for machines without any READMEs or licences on disk."""
    size = _size(rng)
    paras: list[str] = []
    while sum(map(len, paras)) < size:
        paras.append(" ".join(_sentence(rng) for _ in range(rng.randint(2, 6))))
    return _trim("\n\n".join(paras), size)


def gen_python(rng: random.Random) -> str:
    """Fallback only, for machines without stdlib sources."""
    size = _size(rng)
    out: list[str] = []
    while sum(map(len, out)) < size:
        args = ", ".join(_ident(rng, "snake") for _ in range(rng.randint(0, 3)))
        out.append(
            f'def {_ident(rng, "snake")}({args}):\n    """{_sentence(rng)}"""\n'
            f"    {_ident(rng, 'snake')} = {rng.randint(0, 999)}\n    return {_ident(rng, 'snake')}\n"
        )
    return _trim("\n\n".join(out), size)


# Used only when the machine has no real files of that kind.
FALLBACKS = {"prose": gen_prose, "python": gen_python}

GENERATORS = {
    "json_pretty": lambda rng: gen_json(rng, pretty=True),
    "json_compact": lambda rng: gen_json(rng, pretty=False),
    "mcp_envelope": gen_mcp_envelope,
    "typescript": gen_typescript,
    "paths_urls": gen_paths_urls,
    "cjk": gen_cjk,
    "base64": gen_base64,
    "markdown_table": gen_markdown_table,
    "logs": gen_logs,
    "multilingual": gen_multilingual,
}

# --------------------------------------------------------------------------- real files


def _site_packages() -> list[Path]:
    dirs = {Path(p) for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)}
    return sorted(dirs)


def _read(path: Path, limit: int = 400_000) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(limit)
    except (OSError, UnicodeDecodeError):
        return ""


def _find(roots: list[Path], pattern: str, limit: int = 4000) -> list[Path]:
    found: list[Path] = []
    for root in roots:
        if root.is_dir():
            for p in sorted(root.rglob(pattern)):
                if p.is_file():
                    found.append(p)
                    if len(found) >= limit:
                        return found
    return found


_PROSE_LINE = re.compile(r"^[A-Za-z][A-Za-z0-9 ,.;:'()\-\"!?]{30,}$")


def _prose_of(text: str) -> str:
    """Keep the paragraphs that read like English prose (drops code, tables, headers)."""
    paras = []
    for para in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in para.strip().splitlines()]
        if lines and sum(bool(_PROSE_LINE.match(ln)) for ln in lines) >= 0.8 * len(lines):
            paras.append(" ".join(lines) if len(lines) > 1 and len(lines[0]) < 90 else "\n".join(lines))
    return "\n\n".join(paras)


def real_files() -> dict[str, list[tuple[str, str]]]:
    """{kind: [(source, text), ...]} from files found on this machine (sorted, stable)."""
    out: dict[str, list[tuple[str, str]]] = {}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = _site_packages()

    py = [
        p for p in _find([stdlib], "*.py", 3000) if "test" not in p.parts and "site-packages" not in p.parts
    ]
    out["python"] = [(str(p), t) for p in py if (t := _read(p))]

    ts_roots = [
        Path("/usr/lib/node_modules"),
        Path("/usr/local/lib/node_modules"),
        Path.home() / "node_modules",
    ]
    ts = [p for p in _find(ts_roots, "*.ts", 2000)]
    out["typescript"] = [(str(p), t) for p in ts if (t := _read(p))]

    docs = _find(site, "METADATA", 500) + _find(site, "*.md", 500) + _find(site, "LICENSE*", 500)
    docs += _find([Path("/usr/share/common-licenses")], "*", 100)
    prose, tables = [], []
    for p in docs:
        text = _read(p)
        if len(pr := _prose_of(text)) >= MIN_SIZE:
            prose.append((str(p), pr))
        tbl = "\n".join(ln for ln in text.splitlines() if ln.lstrip().startswith("|"))
        if len(tbl) >= MIN_SIZE:
            tables.append((str(p), tbl))
    out["prose"] = prose
    out["markdown_table"] = tables

    cjk_dir = stdlib / "test" / "cjkencodings"
    cjk = [
        p
        for p in _find([cjk_dir], "*-utf8.txt")
        if p.name.split("-")[0] in ("gb2312", "big5", "euc_jp", "shift_jis")
    ]
    out["cjk"] = [(str(p), t) for p in cjk if (t := _read(p))]

    log_roots = [Path("/var/log"), Path.home() / ".npm" / "_logs", Path("/usr/share/doc"), *site]
    out["app_logs"] = [(str(p), t) for p in _find(log_roots, "*.log", 400) if (t := _read(p))]
    html_roots = [Path("/usr/share/doc"), *site, *ts_roots]
    out["html"] = [(str(p), t) for p in _find(html_roots, "*.html", 1500) if len(t := _read(p)) >= MIN_SIZE]
    out["other_languages"] = _translated_man_pages()
    return out


_MAN_DIR = Path("/usr/share/man")


def _translated_man_pages() -> list[tuple[str, str]]:
    """Non-English man pages as text, one entry per language and half: [(lang even files), (lang odd files), ...].

    groff renders a whole batch in one call (a call per page would cost a minute). The entries alternate
    even/odd file halves so build_corpus's even/odd split keeps the train and test pages apart.
    """
    groff = shutil.which("groff")
    if groff is None or not _MAN_DIR.is_dir():
        return []
    out = []
    for lang_dir in sorted(d for d in _MAN_DIR.iterdir() if d.is_dir() and not d.name.startswith("man")):
        pages = sorted(lang_dir.glob("man*/*.gz"))[:60]
        pair = []
        for half in (pages[0::2], pages[1::2]):
            source = b"".join(_gunzip(p) for p in half)
            pair.append((f"{lang_dir} ({len(half)} pages)", _render_man(groff, source) if source else ""))
        if all(len(text) >= MIN_SIZE for _, text in pair):  # a pair or nothing: the alternation must hold
            out += pair
    return out


def _gunzip(path: Path) -> bytes:
    try:
        return gzip.decompress(path.read_bytes())
    except (OSError, EOFError):
        return b""


def _render_man(groff: str, source: bytes) -> str:
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    try:
        done = subprocess.run(
            [groff, "-k", "-man", "-Tutf8", "-P-cbou"], input=source, capture_output=True, timeout=60, env=env
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.decode("utf-8", "replace")


def load_dir(directory: str) -> list[Sample]:
    """Every readable UTF-8 text file under `directory` as kind "real" (cut to MAX_SIZE)."""
    samples = []
    for p in _find([Path(directory)], "*", 5000):
        text = _read(p, MAX_SIZE)
        if len(text) >= MIN_SIZE // 2:
            samples.append(Sample("real", "test", str(p), text))
    return samples


# --------------------------------------------------------------------------- corpus


def _slice(rng: random.Random, text: str) -> str:
    """A random line-aligned window of log-uniform size from a real file."""
    size = _size(rng)
    if len(text) <= size:
        return text
    start = rng.randrange(0, len(text) - size)
    nl = text.find("\n", start)
    start = nl + 1 if 0 <= nl < start + 200 else start
    return _trim(text[start:], size)


def build_corpus(per_kind: int = 40, splits: tuple[str, ...] = ("train", "test")) -> list[Sample]:
    """`per_kind` samples per kind and split. Train and test use disjoint seeds and files."""
    real = real_files()
    samples: list[Sample] = []
    for split in splits:
        offset = 0 if split == "train" else 1
        for kind in KINDS:
            rng = random.Random(f"{kind}/{split}")
            files = real.get(kind, [])[offset::2]  # even files train, odd files test
            # Real files where we have them (half the samples), generated ones for the rest.
            n_real = per_kind // 2 if files and kind in GENERATORS else (per_kind if files else 0)
            for i in range(n_real):
                src, text = files[rng.randrange(len(files))]
                if len(cut := _slice(rng, text)) >= MIN_SIZE // 2:
                    samples.append(Sample(kind, split, f"{src}#{i}", cut))
            gen = GENERATORS.get(kind) or (None if files else FALLBACKS.get(kind))
            if gen is None:
                continue
            for i in range(per_kind - n_real):
                seed = f"{kind}/{split}/{i}"
                samples.append(Sample(kind, split, seed, gen(random.Random(seed))))
    return samples


def iter_kinds(samples: list[Sample]) -> Iterator[tuple[str, list[Sample]]]:
    kinds = sorted({s.kind for s in samples}, key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS))
    for k in kinds:
        yield k, [s for s in samples if s.kind == k]


if __name__ == "__main__":  # quick look: python benchmarks/corpus.py
    corpus = build_corpus()
    for kind, group in iter_kinds(corpus):
        sizes = sorted(len(s.text.encode()) for s in group)
        print(
            f"{kind:15} n={len(group):3}  bytes min={sizes[0]:6} median={sizes[len(sizes) // 2]:6} "
            f"max={sizes[-1]:6}  real={sum(1 for s in group if '/' in s.source and '#' in s.source)}"
        )
