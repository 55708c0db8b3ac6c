"""``instrument()`` / ``uninstrument()`` and the ``opentelemetry-instrument`` entry point.

All instrumentation state (the recorder, the installed adapter shim, the Prometheus service) belongs to one
object, the :class:`McpTokenInstrumentor` instance: ``BaseInstrumentor`` makes the class a singleton, so
``McpTokenInstrumentor()`` is the same object everywhere, and the module functions here are thin calls into it.
Either entry point may instrument or uninstrument, in any order, with the same result.

The adapter is chosen by feature detection, not by version string: ``mcp.shared.dispatcher`` exists only
in mcp 2.x, ``mcp.shared.session`` only in 1.x. An adapter module exposes ``install(recorder)``, which hooks
the SDK and returns the shim (``uninstall()``, ``instrument_server(server)``) that this instance then owns.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import threading
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from .config import Config, ConfigError, load_config
from .core.estimators import EstimatorUnavailable
from .recorder import TokenRecorder

if TYPE_CHECKING:
    from .adapters._common import Shim

logger = logging.getLogger(__name__)


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def detect_adapter() -> str | None:
    """The adapter module for the installed mcp SDK, or None when mcp is missing. By feature detection (a
    module only one SDK major has); whether the release is in the adapter's range is :func:`_load_adapter`'s
    question."""
    from .adapters.supported import ADAPTERS

    return next((adapter.module for adapter in ADAPTERS if _has_module(adapter.marker)), None)


class McpTokenInstrumentor(BaseInstrumentor):
    """The one owner of the instrumentation (and the ``opentelemetry-instrument`` entry point, group
    ``opentelemetry_instrumentor``).

    ``instrument(config=..., tracer_provider=..., meter_provider=...)`` hooks the SDK and returns the
    :class:`TokenRecorder`; all arguments are optional, as the launcher calls it without any. A second call logs
    "already instrumented" and changes nothing; ``uninstrument()`` restores the SDK exactly. A bad configuration
    is one error line and nothing instrumented, unless ``raise_errors=True`` (what ``mcp_token_otel.instrument()``
    passes) asks for the exception.
    """

    _lock = threading.RLock()  # instrument/uninstrument/metrics_app from any thread: one at a time
    _recorder: TokenRecorder | None = None
    _shim: Shim | None = None
    _prometheus: Any = None  # the PrometheusService, once prometheus.enabled or metrics_app() asked for it

    def instrumentation_dependencies(self) -> Collection[str]:
        """The supported range of the adapter the installed release's major gets (``mcp >= 2.0, < 3`` or
        ``mcp >= 1.20, < 2``). BaseInstrumentor requires every string returned, so only the one that applies is."""
        from .adapters.supported import installed_version, requirement_for

        return (requirement_for(installed_version()),)

    @property
    def recorder(self) -> TokenRecorder | None:
        """The active recorder, or None when not instrumented."""
        return self._recorder

    def instrument(self, **kwargs: Any) -> Any:
        with self._lock:
            result = super().instrument(**kwargs)
            # BaseInstrumentor counts an attempt that hooked nothing (no SDK, bad configuration) as instrumented;
            # the flag says whether the SDK is hooked, so a later call can try again.
            self._is_instrumented_by_opentelemetry = self._recorder is not None
            return result

    def uninstrument(self, **kwargs: Any) -> Any:
        with self._lock:
            return super().uninstrument(**kwargs)

    def _instrument(self, **kwargs: Any) -> TokenRecorder | None:
        try:
            config = kwargs.get("config")
            return self._start(
                config if config is not None else load_config(),
                kwargs.get("tracer_provider"),
                kwargs.get("meter_provider"),
            )
        except Exception as exc:
            if kwargs.get("raise_errors"):
                raise
            # Under opentelemetry-instrument nobody can catch it (the launcher logs a traceback and goes on).
            if isinstance(exc, ConfigError):
                logger.error("mcp_token_otel: not instrumenting, bad configuration: %s", exc)
            else:  # e.g. an estimator whose extra is not installed
                logger.error("mcp_token_otel: not instrumenting: %s", exc)
            return None

    def _start(self, config: Config, tracer_provider: Any, meter_provider: Any) -> TokenRecorder | None:
        """Sinks first, hooks last: once the SDK is hooked nothing else can fail half-way."""
        if config.otel.configure:
            _configure_otel(config)
        adapter = _load_adapter()
        if adapter is None:
            return None
        try:
            recorder = TokenRecorder(config, tracer_provider, meter_provider)
        except EstimatorUnavailable as exc:  # the configuration names an estimator whose extra is missing
            raise ConfigError(f"config key 'estimator': {exc}") from None
        service = _new_prometheus(recorder, serve=True) if config.prometheus.enabled else None
        try:
            shim = adapter.install(recorder)  # all or nothing: a failure has restored the SDK already
        except Exception:
            logger.warning("mcp_token_otel: cannot hook the mcp SDK; nothing instrumented", exc_info=True)
            for closable in (recorder, service):
                if closable is not None:
                    with contextlib.suppress(Exception):
                        closable.close()
            return None
        self._recorder, self._shim, self._prometheus = recorder, shim, service
        return recorder

    def _uninstrument(self, **kwargs: Any) -> None:
        recorder, shim, service = self._recorder, self._shim, self._prometheus
        self._recorder = self._shim = self._prometheus = None
        if shim is not None:
            shim.uninstall()
        if recorder is not None:
            recorder.close()
        if service is not None:
            service.close()

    def instrument_once(
        self, config: Config | None = None, *, tracer_provider: Any = None, meter_provider: Any = None
    ) -> TokenRecorder | None:
        """The active recorder, instrumenting first when nothing is (what ``mcp_token_otel.instrument()`` does):
        no "already instrumented" warning, no dependency check, and a bad configuration raises."""
        with self._lock:
            if self._recorder is None:
                self.instrument(config=config, tracer_provider=tracer_provider, meter_provider=meter_provider,
                                skip_dep_check=True, raise_errors=True)
            return self._recorder

    def uninstrument_if_active(self) -> None:
        """``uninstrument()`` without the "already uninstrumented" warning when nothing is instrumented."""
        with self._lock:
            if self.is_instrumented_by_opentelemetry:
                self.uninstrument()

    def instrument_server(self, server: Any) -> None:
        shim = self._shim
        if shim is None:
            logger.warning("mcp_token_otel: instrument_server() called before instrument(); ignored")
            return
        shim.instrument_server(server)

    def prometheus_service(self) -> Any:
        return self._prometheus

    def metrics_app(self, kind: str = "asgi") -> Any:
        with self._lock:
            if self._recorder is None:
                raise RuntimeError("metrics_app() needs instrument() first")
            if self._prometheus is None:
                self._prometheus = _new_prometheus(self._recorder, serve=False)
            service = self._prometheus
        if service is None:
            raise RuntimeError("metrics_app(): the Prometheus sink cannot be set up (see the error logged above)")
        if kind not in ("asgi", "wsgi"):
            raise ValueError(f"kind: expected 'asgi' or 'wsgi', got {kind!r}")
        return service.asgi_app() if kind == "asgi" else service.wsgi_app()


def _load_adapter() -> Any:
    """The adapter module for the installed SDK, or None with one warning line (the release and the supported
    ranges, no traceback) when there is none, it is outside its adapter's range, it lacks an attribute the
    adapter hooks, or the adapter cannot load."""
    from .adapters.supported import cannot_load, installed_version, unsupported

    name = detect_adapter()
    version = installed_version()
    problem = unsupported(name, version)
    if problem is not None or name is None:
        logger.warning("mcp_token_otel: %s; nothing instrumented", problem)
        return None
    try:
        return importlib.import_module(name)
    except Exception as exc:  # an SDK whose internals moved: measure nothing rather than break the application
        logger.warning("mcp_token_otel: %s; nothing instrumented", cannot_load(version, exc))
        return None


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
    ``McpTokenInstrumentor``.) Instrumenting through ``McpTokenInstrumentor().instrument()`` is the same.
    """
    return McpTokenInstrumentor().instrument_once(
        config, tracer_provider=tracer_provider, meter_provider=meter_provider
    )


def uninstrument() -> None:
    """Restore the SDK exactly; sessions that exist keep working, without measurement. A no-op when nothing
    is instrumented."""
    McpTokenInstrumentor().uninstrument_if_active()


def instrument_server(server: Any) -> None:
    """Instrument a server object built before ``instrument()``."""
    McpTokenInstrumentor().instrument_server(server)


def prometheus_service() -> Any:
    """The running Prometheus service (its ``server.url``, registry and apps), or None."""
    return McpTokenInstrumentor().prometheus_service()


def metrics_app(kind: str = "asgi") -> Any:
    """/metrics of the active instrumentation as an ASGI (default) or WSGI app, to mount in a web server
    you already run (e.g. next to an MCP streamable-HTTP app). Call after ``instrument()``."""
    return McpTokenInstrumentor().metrics_app(kind)
