"""The Redis connection pool a ``budget.store`` URL describes (redis-py; imported only when one is configured)."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..config import BudgetConfig, ConfigError, mask_url_password

#: Connections in the pool; past it an operation is answered locally without marking the store down.
_MAX_CONNECTIONS = 64
#: What a failed operation raises: the client's errors, and the socket's own.
FAILURES = (redis.exceptions.RedisError, OSError)


def connection_pool(budget: BudgetConfig) -> redis.ConnectionPool:
    """The pool ``budget.store`` (checked when the configuration was read) describes: every socket operation
    bounded by ``budget.store_timeout``, no retry (a retry would double the deadline: the store's back-off takes
    its place)."""
    kwargs: dict[str, Any] = {
        "socket_timeout": budget.store_timeout,
        "socket_connect_timeout": budget.store_timeout,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        "max_connections": _MAX_CONNECTIONS,
    }
    if budget.store_password:
        kwargs["password"] = budget.store_password
    if budget.store_tls_ca_file:
        kwargs["ssl_ca_certs"] = budget.store_tls_ca_file
    try:
        return redis.ConnectionPool.from_url(budget.store, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"config key 'budget.store': {mask_url_password(str(exc))}") from None
