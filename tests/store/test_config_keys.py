"""The budget.store* keys: defaults, environment, errors naming the key, secrets never printed; the layering of
the store package; open_store's choice."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mcp_token_otel.config import (
    Config,
    ConfigError,
    config_as_dict,
    config_from_dict,
    load_config,
    mask_url_password,
    url_password,
)
from mcp_token_otel.store import MemoryStore, open_store

from ..test_layering import package_imports


def test_defaults_and_environment() -> None:
    budget = Config().budget
    assert (budget.store, budget.store_prefix, budget.store_timeout) == ("memory", "mcp-token-otel:", 0.05)
    assert budget.store_password == budget.store_tls_ca_file == budget.store_key_secret == ""
    env = {"MCP_TOKEN_OTEL_BUDGET_STORE": "rediss://cache.internal:6380/2",
           "MCP_TOKEN_OTEL_BUDGET_STORE_PREFIX": "team-a:",
           "MCP_TOKEN_OTEL_BUDGET_STORE_TIMEOUT": "0.2",
           "MCP_TOKEN_OTEL_BUDGET_STORE_PASSWORD": "12345678",
           "MCP_TOKEN_OTEL_BUDGET_STORE_TLS_CA_FILE": "/etc/ssl/ca.pem",
           "MCP_TOKEN_OTEL_BUDGET_STORE_KEY_SECRET": "k3y"}
    budget = load_config(env=env).budget
    assert (budget.store, budget.store_prefix, budget.store_timeout) == ("rediss://cache.internal:6380/2", "team-a:",
                                                                         0.2)
    assert (budget.store_password, budget.store_tls_ca_file, budget.store_key_secret) == ("12345678",
                                                                                          "/etc/ssl/ca.pem", "k3y")
    for url in ("redis://127.0.0.1", "redis://:pw@10.0.0.1:6379/3", "unix:///run/redis/redis.sock?db=1"):
        assert config_from_dict({"budget": {"store": url}}).budget.store == url


@pytest.mark.parametrize(("section", "words"), [
    ({"store": "http://cache:6379"}, "budget.store: expected 'memory' or a redis://"),
    ({"store": "redis"}, "budget.store: expected 'memory' or a redis://"),
    ({"store": "redis://"}, "budget.store: expected a host"),
    ({"store": "redis://cache:70000"}, "budget.store: expected 'memory' or a redis://"),
    ({"store": "redis://cache/db"}, "budget.store: expected a database number"),
    ({"store": "unix://"}, "budget.store: expected a socket path"),
    ({"store": 6379}, "'budget.store': expected a string"),
    ({"store_timeout": 0}, "'budget.store_timeout': expected a number of seconds above 0"),
    ({"store_timeout": 60}, "'budget.store_timeout': expected a number of seconds above 0, at most 10"),
    ({"store_prefix": ""}, "'budget.store_prefix': expected a non-empty string"),
    ({"store_tls_ca_file": "/ca.pem"}, "budget.store_tls_ca_file: expected only with a rediss://"),
    ({"store_tls_ca_file": "/ca.pem", "store": "redis://h"}, "budget.store_tls_ca_file"),
])
def test_bad_values_name_the_key(section: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"budget": section})
    assert words in str(caught.value)


def test_url_passwords_never_shown() -> None:
    assert mask_url_password("redis://user:pa55word@cache:6379/0") == "redis://user:<hidden>@cache:6379/0"
    assert mask_url_password("rediss://:p@ss@cache/0?x=1") == "rediss://:<hidden>@cache/0?x=1"
    assert mask_url_password("unix:///run/r.sock?db=0&password=abc&x=1") == \
        "unix:///run/r.sock?db=0&password=<hidden>&x=1"
    assert mask_url_password("redis://cache:6379/0") == "redis://cache:6379/0"
    assert url_password("redis://u:pa55word@h") == "pa55word" and url_password("unix:///s?password=abc") == "abc"
    with pytest.raises(ConfigError) as caught:  # a bad URL's message masks it too
        config_from_dict({"budget": {"store": "redis://u:pa55word@cache:port/0"}})
    assert "pa55word" not in str(caught.value) and "<hidden>" in str(caught.value)
    config = config_from_dict({"budget": {"store": "redis://u:pa55word@cache/0", "store_password": "other-pw",
                                          "store_key_secret": "hmac-secret"}})
    shown = config_as_dict(config, hide_secrets=True)["budget"]
    assert shown["store"] == "redis://u:<hidden>@cache/0"
    assert shown["store_password"] == shown["store_key_secret"] == "<hidden>"
    assert config_as_dict(config)["budget"]["store"] == "redis://u:pa55word@cache/0"


def test_config_command_masks_the_store_secrets() -> None:
    env = {**os.environ, "MCP_TOKEN_OTEL_BUDGET_STORE": "redis://app:url-secret-9@cache:6379/0",
           "MCP_TOKEN_OTEL_BUDGET_STORE_PASSWORD": "key-secret-7", "MCP_TOKEN_OTEL_BUDGET_STORE_KEY_SECRET": "hm4c-s3"}
    out = subprocess.run([sys.executable, "-m", "mcp_token_otel.cli", "config"], capture_output=True, env=env,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode()
    assert "store: redis://app:<hidden>@cache:6379/0" in text
    assert "url-secret-9" not in text and "key-secret-7" not in text and "hm4c-s3" not in text
    env["MCP_TOKEN_OTEL_BUDGET_STORE"] = "redis://app:url-secret-9@cache:port/0"  # a bad URL: its error masks it
    out = subprocess.run([sys.executable, "-m", "mcp_token_otel.cli", "config"], capture_output=True, env=env,
                         timeout=60, check=False)
    assert out.returncode == 2 and b"budget.store" in out.stderr and b"url-secret-9" not in out.stderr


def test_open_store_memory_by_default() -> None:
    assert isinstance(open_store(Config().budget), MemoryStore)


def test_store_layering() -> None:
    """The store sits beside the core: it imports the core, the config and the redis client, never the
    recorder, emitters, adapters, proxy or an MCP SDK; nothing below the recorder imports it."""
    imports = package_imports()
    allowed = ("mcp_token_otel.store", "mcp_token_otel.core", "mcp_token_otel.config", "redis")
    for imp in imports:
        if imp.importer.startswith("mcp_token_otel.store") and imp.target.split(".")[0] == "mcp_token_otel":
            assert imp.target.startswith(allowed), str(imp)
        if imp.importer.startswith(("mcp_token_otel.core", "mcp_token_otel.config")):
            assert not imp.target.startswith("mcp_token_otel.store"), str(imp)
    for imp in imports:
        if imp.target == "redis" or imp.target.startswith("redis."):
            assert imp.importer in ("mcp_token_otel.store.redis_store", "mcp_token_otel.store.connection"), str(imp)


def test_importing_the_package_loads_no_redis_client() -> None:
    code = "import sys, mcp_token_otel, mcp_token_otel.store; print('redis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
    assert out.stdout.strip() == b"False"
