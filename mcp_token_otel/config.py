"""Configuration: one YAML file plus ``MCP_TOKEN_OTEL_*`` environment overrides.

The schema is the dataclasses below; every key has a default, so an empty file (or none) is valid.
Environment variables name a key path in upper case joined by ``_``: ``budget.context_window`` is
``MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW``; values are parsed as YAML scalars. ``MCP_TOKEN_OTEL_CONFIG``
names the file. Unknown keys, wrong types and inconsistent values raise ``ConfigError`` naming the key
and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import SplitResult, unquote, urlsplit

import yaml

from .core.budget import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_EXHAUSTION_RATIO,
    DEFAULT_WARNING_RATIO,
    validate_budget,
)
from .core.budget_key import DEFAULT_BUDGET_KEY, parse_key_sources
from .core.estimators import ESTIMATOR_NAMES, get_estimator
from .core.guard.settings import GuardSettings
from .core.measure import Policy
from .core.media import IMAGE_TOKEN_RULES, ImageRule
from .core.risk import DEFAULT_MAX_OVERHEAD_RATIO, DEFAULT_THRESHOLDS, RiskThresholds

ENV_PREFIX = "MCP_TOKEN_OTEL_"
ENV_CONFIG_FILE = "MCP_TOKEN_OTEL_CONFIG"
#: Set-up variables read by scripts/bootstrap, scripts/run and scripts/test (the virtualenv, an extra pip
#: requirement): they share the prefix but are not configuration keys, so the loader ignores them.
SETUP_VARIABLES = frozenset({"MCP_TOKEN_OTEL_VENV", "MCP_TOKEN_OTEL_PIN"})
# Variables with the prefix that are not configuration keys.
_ENV_NOT_KEYS = frozenset({ENV_CONFIG_FILE, *SETUP_VARIABLES})


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type or inconsistent; the message names the key."""


def _check(expect: str, ok: Callable[[Any], bool]) -> dict[str, Any]:
    """Field metadata: a predicate on the (type-checked) value and the words for what is expected."""
    return {"expect": expect, "ok": ok}


_POSITIVE_INT = _check("a positive integer", lambda v: v > 0)
_POSITIVE = _check("a positive number", lambda v: v > 0)
_RATIO = _check("a number in (0, 1]", lambda v: 0 < v <= 1)


@dataclass(frozen=True)
class RiskConfig:
    thresholds: RiskThresholds = DEFAULT_THRESHOLDS
    max_overhead_ratio: float = field(default=DEFAULT_MAX_OVERHEAD_RATIO, metadata=_RATIO)


#: URL schemes ``budget.store`` accepts besides ``memory``.
STORE_SCHEMES = ("redis", "rediss", "unix")


def mask_url_password(url: str) -> str:
    """``url`` with its password (``redis://user:secret@host``, or a ``password=`` query parameter) shown as
    ``<hidden>``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    userinfo, at, host = rest[:end].rpartition("@")
    user, colon, password = userinfo.partition(":")
    if at and colon and password:
        rest = f"{user}:<hidden>@{host}{rest[end:]}"
    return scheme + "://" + _QUERY_PASSWORD.sub(r"\1<hidden>", rest)


_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def url_password(url: str) -> str:
    """The password ``url`` carries (its user part or a ``password=`` query parameter), or ''."""
    try:
        split = urlsplit(url)
        password = split.password or ""
    except ValueError:
        return ""
    query = _QUERY_PASSWORD.search("?" + split.query) if split.query else None
    return password or (unquote(query.group(0).partition("=")[2]) if query else "")


def check_store_url(value: str) -> None:
    """Raise ValueError naming ``budget.store`` unless ``value`` is ``memory`` or a Redis URL it can use."""
    if value == "memory":
        return
    shown = mask_url_password(value)
    expect = "expected 'memory' or a redis://, rediss:// or unix:// URL"
    try:
        url: SplitResult = urlsplit(value)
        port = url.port
    except ValueError as exc:
        raise ValueError(f"budget.store: {expect}, got {shown!r} ({exc})") from None
    if url.scheme not in STORE_SCHEMES:
        raise ValueError(f"budget.store: {expect}, got {shown!r}")
    if url.scheme == "unix":
        if not url.path:
            raise ValueError(f"budget.store: expected a socket path, as in unix:///run/redis.sock, got {shown!r}")
        return
    if not url.hostname:
        raise ValueError(f"budget.store: expected a host, as in redis://127.0.0.1:6379/0, got {shown!r}")
    if port == 0:
        raise ValueError(f"budget.store: expected a port from 1 to 65535, got {shown!r}")
    database = url.path.strip("/")
    if database and not database.isdigit():
        raise ValueError(f"budget.store: expected a database number after the host (/0), got {shown!r}")


@dataclass(frozen=True)
class BudgetConfig:
    context_window: int = field(default=DEFAULT_CONTEXT_WINDOW, metadata=_POSITIVE_INT)
    warning_ratio: float = field(default=DEFAULT_WARNING_RATIO, metadata=_RATIO)
    exhaustion_ratio: float = field(default=DEFAULT_EXHAUSTION_RATIO, metadata=_RATIO)
    max_sessions: int = field(default=10_000, metadata=_POSITIVE_INT)
    #: Seconds without traffic after which a budget ends (its utilization observed once); the only end of a
    #: budget keyed by anything but a connection.
    idle_timeout: float = field(default=1800.0, metadata=_POSITIVE)
    #: What a message's budget is keyed by: the first source present (core/budget_key.py, docs/instrumentation.md).
    key: list[str] = field(default_factory=lambda: list(DEFAULT_BUDGET_KEY))
    #: Client side: add the context's gen_ai.conversation.id baggage entry to outgoing requests that carry no
    #: baggage (the SDK sends baggage itself on JSON-RPC transports; this covers the rest). Off: nothing changes.
    propagate: bool = False
    #: Where budgets are counted: ``memory`` (this process) or a Redis URL (``redis://``, ``rediss://`` for TLS,
    #: ``unix://``) that every replica of a server or proxy shares (mcp_token_otel/store, the ``redis`` extra).
    store: str = "memory"
    #: Prefix of every Redis key, so that two deployments can share one Redis.
    store_prefix: str = field(default="mcp-token-otel:", metadata=_check("a non-empty string", bool))
    #: Seconds one store operation may take; past it the message is counted locally (never blocked longer).
    store_timeout: float = field(default=0.05, metadata=_check("a number of seconds above 0, at most 10",
                                                                lambda v: 0 < v <= 10))
    #: The Redis password when the URL carries none (kept out of the URL, the environment's listing and output).
    store_password: str = ""
    #: A PEM bundle of the certificate authorities a ``rediss://`` server's certificate is checked against.
    store_tls_ca_file: str = ""
    #: The secret budget keys are hashed with (HMAC-SHA256) before they are stored; the same on every replica.
    #: Empty: a hash derived from ``store_prefix``, which hides keys from a casual reader but not from a guess.
    store_key_secret: str = ""

    def __post_init__(self) -> None:
        validate_budget(self.context_window, self.warning_ratio, self.exhaustion_ratio)
        check_store_url(self.store)
        if self.store_tls_ca_file and not self.store.startswith("rediss://"):
            raise ValueError("budget.store_tls_ca_file: expected only with a rediss:// budget.store")
        if isinstance(self.key, str):  # one source, or a comma-separated list, as a string
            object.__setattr__(self, "key", _build_list(self.key, "budget.key"))
        elif isinstance(self.key, tuple):
            object.__setattr__(self, "key", list(self.key))
        if not self.key:
            raise ValueError(f"budget.key: expected at least one key source, such as {list(DEFAULT_BUDGET_KEY)}")
        parse_key_sources(self.key)  # ValueError naming budget.key[i]


@dataclass(frozen=True)
class SpansConfig:
    #: Opt-in: put tool arguments and results on spans (gen_ai.tool.call.arguments / .result).
    capture_content: bool = False
    #: Captured content is truncated to this many characters.
    max_content_chars: int = field(default=2048, metadata=_POSITIVE_INT)
    #: mcp 1.x only (2.x never adds trace context; the SDK does, as the application configured it): where the
    #: shim writes W3C trace context into a request's ``params._meta``. ``in_process``: only between sessions of
    #: this process (in-memory pairs), where the receiving shim removes it before any handler sees it;
    #: ``always``: every request with params (a peer without the shim sees the keys); ``never``.
    propagate_context: str = field(
        default="in_process",
        metadata=_check("one of in_process, always, never", lambda v: v in ("in_process", "always", "never")),
    )


@dataclass(frozen=True)
class MetricsConfig:
    #: Distinct tool names kept as metric labels; later names share the overflow value.
    max_tool_names: int = field(default=100, metadata=_POSITIVE_INT)
    overflow_tool_name: str = field(default="_other", metadata=_check("a non-empty string", bool))
    #: Record OpenTelemetry SDK metric points on a background thread instead of in the MCP call: a lower
    #: median call, but more in total (the GIL hand-overs cost more than the points) and in the tail.
    defer_otel: bool = False
    #: Also keep the token histogram of requests (direction "input"), on /metrics and in OTel. Off: a request's
    #: tokens go to the counters only (their rate and sum stay exact); its distribution is rarely read and the
    #: histogram doubles the largest family (about 350 KB of a scrape at 100 tools).
    input_histograms: bool = False
    #: The ``server`` label/attribute on every series; empty: the server's own name (server side), the
    #: ``serverInfo.name`` of initialize (client side), the proxy's ``--name``.
    server_name: str = ""
    #: Distinct server names kept as labels; later names share the overflow value.
    max_server_names: int = field(default=20, metadata=_POSITIVE_INT)
    #: Seconds within which the same tool called with the same arguments in one session (or conversation)
    #: counts its output tokens as ``repeated`` waste; 0 turns the check off (no argument digest at all).
    repeat_window: float = field(default=60.0, metadata=_check("a number of seconds >= 0", lambda v: v >= 0))
    #: Seconds within which a retry of an ``input_required`` answer continues the same logical call (the
    #: user's answer time; the SDK's sealed state lives 600 s).
    logical_call_window: float = field(default=600.0, metadata=_POSITIVE)
    #: Seconds a task's result is awaited to be attributed to the call that created it (at most; a task's own
    #: ``ttlMs`` ends it sooner).
    task_window: float = field(default=3600.0, metadata=_POSITIVE)


@dataclass(frozen=True)
class PrometheusConfig:
    #: Serve /metrics from instrument() (the demo always does).
    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = field(default=9464, metadata=_check("a port number from 0 to 65535", lambda v: 0 <= v <= 65535))
    #: Serve HTTPS when set (PEM files); both or neither.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: Require HTTP basic auth when set; both or neither.
    basic_auth_username: str = ""
    basic_auth_password: str = ""
    #: Open /metrics connections at most; beyond, new ones are refused at once (503) until some close.
    max_connections: int = field(default=512, metadata=_POSITIVE_INT)
    #: Seconds a client has for the TLS handshake and the whole request head (slow-drip clients are dropped).
    request_timeout_seconds: float = field(default=5.0, metadata=_POSITIVE)
    #: Seconds a finished rendering may be reused by scrapes that arrive while other clients wait for an answer
    #: (0: share only renderings in progress); a scrape on an otherwise idle server always renders afresh.
    render_max_age_seconds: float = field(
        default=1.0, metadata=_check("a number of seconds from 0 to 60", lambda v: 0 <= v <= 60)
    )
    #: Sustained output-token budgets (tokens per second) exported for the McpTokenSustainedHighUsage alert.
    tool_output_rate_budget: float = field(default=100.0, metadata=_POSITIVE)
    service_output_rate_budget: float = field(default=500.0, metadata=_POSITIVE)
    #: Also expose the ``_created`` series of every counter and histogram (one more line per series).
    created_series: bool = False
    #: Where stdio proxies keep their metrics for ``mcp-token-otel serve`` ("": the per-user default,
    #: ``$XDG_STATE_HOME/mcp-token-otel/metrics`` or ``~/.local/state/mcp-token-otel/metrics``).
    state_dir: str = ""

    def __post_init__(self) -> None:
        for first, second in (("tls_cert_file", "tls_key_file"), ("basic_auth_username", "basic_auth_password")):
            if bool(getattr(self, first)) != bool(getattr(self, second)):
                raise ValueError(f"prometheus.{first}: expected together with prometheus.{second} (both or neither)")


@dataclass(frozen=True)
class OtelConfig:
    #: When true, instrument() builds OTLP exporters from the standard OTEL_* variables (configure_otel),
    #: unless the application already set its own tracer/meter providers.
    configure: bool = False
    #: At exit, seconds to wait for the last spans and metrics of the exporters configure_otel built; a dead
    #: collector then costs this, not the exporters' 10 s timeout and retries per signal.
    shutdown_timeout_seconds: float = field(default=3.0, metadata=_POSITIVE)


#: The sides of an MCP session the shim can instrument (``instrumentation.sides``).
INSTRUMENTATION_SIDES: tuple[str, ...] = ("client", "server")


@dataclass(frozen=True)
class InstrumentationConfig:
    #: The sides the shim instruments in this process: an operator who owns only the server (or only the
    #: client) leaves the other side to its owner and pays for one side per call.
    sides: list[str] = field(
        default_factory=lambda: list(INSTRUMENTATION_SIDES),
        metadata=_check(
            "a non-empty list of " + ", ".join(INSTRUMENTATION_SIDES) + " (or one of them)",
            lambda v: bool(v) and all(side in INSTRUMENTATION_SIDES for side in v),
        ),
    )

    def __post_init__(self) -> None:
        if isinstance(self.sides, str):  # one side, or a comma-separated list, as a string
            object.__setattr__(self, "sides", _build_list(self.sides, "instrumentation.sides"))
        elif isinstance(self.sides, tuple):
            object.__setattr__(self, "sides", list(self.sides))


@dataclass(frozen=True)
class Config:
    estimator: str = field(
        default="default",
        metadata=_check("one of " + ", ".join(ESTIMATOR_NAMES), lambda v: v in ESTIMATOR_NAMES),
    )
    #: How an image block is counted: from its dimensions (area, tiles, patches) or as its base64 text.
    image_tokens: str = field(
        default="area",
        metadata=_check("one of " + ", ".join(IMAGE_TOKEN_RULES), lambda v: v in IMAGE_TOKEN_RULES),
    )
    #: Which sides of a session the shim instruments.
    instrumentation: InstrumentationConfig = field(default_factory=InstrumentationConfig)
    risk: RiskConfig = field(default_factory=RiskConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    spans: SpansConfig = field(default_factory=SpansConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)
    otel: OtelConfig = field(default_factory=OtelConfig)
    #: Guardrails (docs/guardrails.md); the dataclasses live in core/guard/settings.py.
    guard: GuardSettings = field(default_factory=GuardSettings)


# ---------------------------------------------------------------------------------------------------
# Loading


#: Keys whose values never appear in messages or in `mcp-token-otel config` output.
SECRET_KEYS = frozenset({"prometheus.basic_auth_password", "budget.store_password", "budget.store_key_secret"})
#: Keys holding a URL whose password is masked in messages and output.
URL_KEYS = frozenset({"budget.store"})


#: Longest shown value in a message: a 100 KB value must not become a 100 KB error line.
_SHOWN_CHARS = 80


def _shown(path: str, value: Any) -> str:
    if path in SECRET_KEYS:
        return "<hidden>"
    if path in URL_KEYS and isinstance(value, str):
        value = mask_url_password(value)
    try:
        text = repr(value)
    except RecursionError:  # a value nested thousands deep
        return f"a {_type_name(value)} nested too deeply to show"
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}... ({len(text):,} characters)"


def _type_name(value: Any) -> str:
    return type(value).__name__


#: An exponent without a dot (1e9, 5E-3): a number in YAML 1.2, a string to PyYAML (YAML 1.1).
_EXPONENT_NUMBER = re.compile(r"[-+]?(\.[0-9]+|[0-9]+\.?[0-9]*)[eE][-+]?[0-9]+")


def _yaml_number(value: Any) -> int | float | None:
    """``value`` as a number: an int or float YAML read, or a string YAML 1.2 reads as one (``1e9``); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value.strip()):
        return float(value)
    return None


def _expect_type(path: str, value: Any, hint: Any) -> Any:
    """Check a leaf value against its annotation; ints are accepted where floats are expected."""
    if typing.get_origin(hint) is types.UnionType:  # `X | None`: an optional override (guard.tools.*)
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return None if value is None else _expect_type(path, value, inner[0])
    if typing.get_origin(hint) is list:  # guard.sides, instrumentation.sides
        return _build_list(value, path)
    if hint is bool:
        ok = isinstance(value, bool)
        words = "true or false"
    elif hint is int:
        number = _yaml_number(value)
        ok = isinstance(number, int) or (isinstance(number, float) and number.is_integer())
        words = "an integer"
        value = int(number) if ok and number is not None else value
    elif hint is float:
        number = _yaml_number(value)
        ok = number is not None
        words = "a number"
        value = float(number) if number is not None else value
    elif hint is str:
        ok = isinstance(value, str)
        words = "a string"
    else:
        raise TypeError(f"unsupported config annotation {hint!r} at {path}")
    if not ok:
        raise ConfigError(f"config key '{path}': expected {words}, got {_shown(path, value)} ({_type_name(value)})")
    return value


def _unknown_key(path: str, key: str, known: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    where = f"'{path}'" if path else "the top level"
    return ConfigError(
        f"unknown config key '{path + '.' if path else ''}{key}'{hint}; known keys in {where}: "
        + ", ".join(known)
    )


def _build(cls: type, data: Any, path: str) -> Any:
    """Build dataclass ``cls`` from a mapping, checking every key and value."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"config key '{path or '<root>'}': expected a mapping, got {_type_name(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise _unknown_key(path, str(key), list(fields))
        key_path = f"{path}.{key}" if path else key
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, {} if value is None else value, key_path)
            continue
        if typing.get_origin(hint) is dict:
            kwargs[key] = _build_dict(hint, {} if value is None else value, key_path)
            continue
        if value is False and key == "mode" and key_path.startswith("guard."):
            value = "off"  # YAML 1.1 reads a bare `off` as false
        value = _expect_type(key_path, value, hint)
        meta = fields[key].metadata
        if meta and not meta["ok"](value):
            raise ConfigError(f"config key '{key_path}': expected {meta['expect']}, got {_shown(key_path, value)}")
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as exc:  # cross-field checks name their keys already
        raise ConfigError(f"config key {exc}") from None


def _build_dict(hint: Any, data: Any, path: str) -> dict[str, Any]:
    """A mapping of names to values or sections (guard.pricing, guard.tools), every entry checked."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"config key '{path}': expected a mapping, got {_type_name(data)}")
    _, value_hint = typing.get_args(hint)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"config key '{path}': expected names as keys, got {key!r}")
        if isinstance(value_hint, type) and dataclasses.is_dataclass(value_hint):
            out[key] = _build(value_hint, {} if value is None else value, f"{path}.{key}")
        else:
            out[key] = _expect_type(f"{path}.{key}", value, value_hint)
    return out


def _build_list(data: Any, path: str) -> list[str]:
    """A list of names (guard.sides): a YAML list of strings, or one string of comma-separated names."""
    if isinstance(data, str):
        return [part.strip() for part in data.split(",") if part.strip()]
    if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
        raise ConfigError(
            f"config key '{path}': expected a list of names or a comma-separated string, got {_shown(path, data)}"
        )
    return list(data)


def env_keys(cls: type = Config, path: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """Every environment variable name and the key path it sets."""
    out: dict[str, tuple[str, ...]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key_path = (*path, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(env_keys(hints[f.name], key_path))
        else:
            out[ENV_PREFIX + "_".join(key_path).upper()] = key_path
    return out


def _leaf_type(path: tuple[str, ...]) -> Any:
    cls: Any = Config
    for part in path:
        cls = typing.get_type_hints(cls)[part]
    return cls


def _env_scalar(raw: str, mapping: bool = False) -> Any:
    """A variable's value as a YAML scalar (or, for a key whose type is a mapping, a YAML flow mapping);
    anything else (a list, a mapping where a scalar belongs, unparsable or nested too deeply to parse) stays
    the raw text, which the type check then rejects by name."""
    if not raw.strip():
        return None
    try:
        value = yaml.safe_load(raw)
    except (yaml.YAMLError, RecursionError):
        return raw
    if mapping and isinstance(value, (dict, list)):  # a flow mapping or list where the key takes one
        return value
    return value if isinstance(value, (bool, int, float, str)) or value is None else raw


def _yaml_error(path: Any, exc: yaml.YAMLError) -> ConfigError:
    """One line naming the file and position, never the offending text: PyYAML quotes the line, which may
    hold a secret (a basic-auth password)."""
    where = ""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        where = f" at line {mark.line + 1}, column {mark.column + 1}"
    problem = getattr(exc, "problem", None) or type(exc).__name__
    # Problems may quote a token of the file; keep one-character quotes ('\t'), hide longer ones.
    problem = re.sub(r"(['\"])[^'\"\n]{2,}\1", "<text>", str(problem)).replace("\n", " ")
    return ConfigError(f"config file {str(path)!r} is not valid YAML{where}: {problem}")


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> None:
    known = env_keys()
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name in _ENV_NOT_KEYS:
            continue
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown environment variable {name}{hint}")
        leaf_type = _leaf_type(known[name])
        if leaf_type is str:
            value: Any = raw  # kept verbatim: a password "12345678" or a host "0x1F" is text, not a number
        elif leaf_type is bool and raw.strip() in ("0", "1"):
            value = raw.strip() == "1"  # the shell's convention for switches, besides true/false
        else:
            value = _env_scalar(raw, mapping=typing.get_origin(leaf_type) in (dict, Mapping, list))
        *parents, leaf = known[name]
        node = data
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[leaf] = raw if value is None else value


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Load the YAML file (``path``, else ``$MCP_TOKEN_OTEL_CONFIG``, else none) and apply env overrides."""
    env = os.environ if env is None else env
    path = path if path is not None else env.get(ENV_CONFIG_FILE) or None
    data: Any = {}
    if path is not None:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror or exc}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file {str(path)!r} is not valid UTF-8 (first bad byte at offset {exc.start})"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise _yaml_error(path, exc) from None
        except RecursionError:
            raise ConfigError(f"config file {str(path)!r} is nested too deeply to parse") from None
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise ConfigError(
                f"config file {str(path)!r}: expected a mapping at the top level, got {_type_name(data)}"
            )
    _apply_env(data, env)
    return config_from_dict(data)


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Build and validate a Config from plain data (as parsed from YAML)."""
    return _build(Config, dict(data), "")


def config_as_dict(config: Config, *, hide_secrets: bool = False) -> dict[str, Any]:
    """The configuration as plain data, suitable for YAML; secrets masked with ``hide_secrets``."""
    data = dataclasses.asdict(config)
    if hide_secrets:
        for key in SECRET_KEYS:
            section, leaf = key.split(".")
            if data[section][leaf]:
                data[section][leaf] = "<hidden>"
        for key in URL_KEYS:
            section, leaf = key.split(".")
            data[section][leaf] = mask_url_password(data[section][leaf])
    return data


def build_policy(config: Config) -> Policy:
    """The measuring policy a configuration describes (loads the estimator it names)."""
    return Policy(
        estimator=get_estimator(config.estimator),
        estimator_name=config.estimator,
        thresholds=config.risk.thresholds,
        max_overhead_ratio=config.risk.max_overhead_ratio,
        image_tokens=cast(ImageRule, config.image_tokens),  # validated against IMAGE_TOKEN_RULES at load
    )
