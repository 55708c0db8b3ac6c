"""``instrument()`` / ``uninstrument()`` and the ``opentelemetry-instrument`` entry point.

The adapter is chosen by feature detection, not by version string: ``mcp.shared.dispatcher`` exists only
in mcp 2.x, ``mcp.shared.session`` only in 1.x. An adapter module exposes ``install(recorder)``,
``uninstall()`` and ``instrument_server(server)``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import threading
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from .config import Config, ConfigError, load_config
from .core.estimators import EstimatorUnavailable
from .recorder import TokenRecorder

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_state: tuple[TokenRecorder, Any] | None = None  # (recorder, adapter module)
_prometheus: Any = None  # the PrometheusService, once prometheus.enabled or metrics_app() asked for it


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def detect_adapter() -> str | None:
    """The adapter module for the installed mcp SDK, or None when mcp is missing."""
    if _has_module("mcp.shared.dispatcher"):
        return "mcp_token_otel.adapters.mcp_v2"
    if _has_module("mcp.shared.session"):
        return "mcp_token_otel.adapters.mcp_v1"
    return None


def instrument(
    config: Config | None = None,
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
) -> TokenRecorder | None:
    """Instrument the installed mcp SDK; idempotent (a second call returns the active recorder).

    ``config`` defaults to ``load_config()`` (``MCP_TOKEN_OTEL_*`` variables and file). Providers default
    to the global ones; with ``otel.configure`` true, OTLP exporters are set up first from OTEL_*.
    Returns the recorder, or None when no supported mcp SDK is installed or it cannot be hooked.

    A bad configuration raises ``ConfigError`` naming the key: the caller can fix it. Anything else is all or
    nothing and never raises into the application: an optional part that fails (OTLP set-up, the Prometheus
    sink or its server) is logged in one line and skipped; a failure to hook the SDK restores it and
    returns None. (Under ``opentelemetry-instrument`` a bad configuration is one log line too; see
    ``McpTokenInstrumentor``.)
    """
    global _state, _prometheus
    with _lock:
        if _state is not None:
            return _state[0]
        config = config if config is not None else load_config()
        if config.otel.configure:
            _configure_otel(config)
        name = detect_adapter()
        if name is None:
            logger.warning("mcp_token_otel: no supported mcp SDK found; nothing instrumented")
            return None
        try:
            adapter = importlib.import_module(name)
        except Exception:  # an SDK whose internals moved: measure nothing rather than break the application
            logger.warning("mcp_token_otel: adapter %s cannot load; nothing instrumented", name, exc_info=True)
            return None
        try:
            recorder = TokenRecorder(config, tracer_provider, meter_provider)
        except EstimatorUnavailable as exc:  # the configuration names an estimator whose extra is missing
            raise ConfigError(f"config key 'estimator': {exc}") from None
        # Sinks first, hooks last: once the SDK is patched nothing else can fail half-way.
        service = _new_prometheus(recorder, serve=True) if config.prometheus.enabled else None
        try:
            adapter.install(recorder)
        except Exception:
            logger.warning("mcp_token_otel: cannot hook the mcp SDK; nothing instrumented", exc_info=True)
            with contextlib.suppress(Exception):
                adapter.uninstall()  # restore whatever was patched before the failure
            with contextlib.suppress(Exception):
                recorder.close()
            if service is not None:
                with contextlib.suppress(Exception):
                    service.close()
            return None
        _state = (recorder, adapter)
        _prometheus = service
        return recorder


def _configure_otel(config: Config) -> None:
    from .emitters.otel_setup import configure_otel

    try:
        configure_otel(shutdown_timeout=config.otel.shutdown_timeout_seconds)
    except Exception as exc:  # e.g. protocol grpc without its exporter package
        logger.error("mcp_token_otel: cannot set up OTLP export (otel.configure), measuring without it: %s", exc)


def _new_prometheus(recorder: TokenRecorder, *, serve: bool) -> Any:
    """A PrometheusService feeding from ``recorder``, or None (logged) when its sink cannot be built."""
    from .emitters.prometheus_service import start_prometheus

    try:
        return start_prometheus(recorder, recorder.config.prometheus, serve=serve)
    except Exception as exc:  # e.g. PROMETHEUS_MULTIPROC_DIR names a directory that does not exist
        multiproc = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        where = f" (PROMETHEUS_MULTIPROC_DIR={multiproc!r})" if multiproc else ""
        logger.error("mcp_token_otel: Prometheus metrics disabled, cannot set up their sink%s: %s", where, exc)
        return None


def _start_prometheus(recorder: TokenRecorder, *, serve: bool) -> Any:
    global _prometheus
    if _prometheus is None:
        _prometheus = _new_prometheus(recorder, serve=serve)
    return _prometheus


def prometheus_service() -> Any:
    """The running Prometheus service (its ``server.url``, registry and apps), or None."""
    return _prometheus


def metrics_app(kind: str = "asgi") -> Any:
    """/metrics of the active instrumentation as an ASGI (default) or WSGI app, to mount in a web server
    you already run (e.g. next to an MCP streamable-HTTP app). Call after ``instrument()``."""
    with _lock:
        if _state is None:
            raise RuntimeError("metrics_app() needs instrument() first")
        service = _start_prometheus(_state[0], serve=False)
    if service is None:
        raise RuntimeError("metrics_app(): the Prometheus sink cannot be set up (see the error logged above)")
    if kind not in ("asgi", "wsgi"):
        raise ValueError(f"kind: expected 'asgi' or 'wsgi', got {kind!r}")
    return service.asgi_app() if kind == "asgi" else service.wsgi_app()


def uninstrument() -> None:
    """Restore the SDK exactly; sessions that exist keep working, without measurement."""
    global _state
    with _lock:
        if _state is None:
            return
        global _prometheus
        recorder, adapter = _state
        _state = None
        adapter.uninstall()
        recorder.close()
        if _prometheus is not None:
            _prometheus.close()
            _prometheus = None


def instrument_server(server: Any) -> None:
    """Instrument a server object built before ``instrument()``."""
    if _state is None:
        logger.warning("mcp_token_otel: instrument_server() called before instrument(); ignored")
        return
    _state[1].instrument_server(server)


class McpTokenInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """``opentelemetry-instrument`` entry point (group ``opentelemetry_instrumentor``)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("mcp >= 1.20",)

    def _instrument(self, **kwargs: Any) -> None:
        # Nobody can catch an exception here (the launcher logs a traceback and goes on): a bad
        # configuration is one error line and nothing is instrumented.
        try:
            config = kwargs.get("config") or load_config()
            instrument(
                config,
                tracer_provider=kwargs.get("tracer_provider"),
                meter_provider=kwargs.get("meter_provider"),
            )
        except ConfigError as exc:
            logger.error("mcp_token_otel: not instrumenting, bad configuration: %s", exc)
        except Exception as exc:  # e.g. an estimator whose extra is not installed
            logger.error("mcp_token_otel: not instrumenting: %s", exc)

    def _uninstrument(self, **kwargs: Any) -> None:
        uninstrument()
