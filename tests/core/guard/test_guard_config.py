"""The guard: section: pinned keys, env overrides, per-tool globs, pricing, and errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_token_otel.config import Config, ConfigError, config_as_dict, config_from_dict, env_keys, load_config
from mcp_token_otel.core.guard import DEFAULT_PRICING, GuardEngine, GuardSettings, ToolGuard
from mcp_token_otel.core.guard.settings import resolve_tool


def test_defaults_are_off_and_change_nothing() -> None:
    guard = load_config(env={}).guard
    assert guard == GuardSettings()
    assert (guard.mode, guard.max_response_tokens, guard.session_hard_limit, guard.annotate_meta) == (
        "off", 0, False, False)
    assert (guard.rate_limit, guard.calls_per_minute, guard.max_chain_depth, guard.model) == (False, 30, 0, "")
    assert guard.pricing == dict(DEFAULT_PRICING) and guard.tools == {}
    assert GuardEngine(guard).active is False


def test_pinned_env_overrides_work() -> None:
    config = load_config(env={"MCP_TOKEN_OTEL_GUARD_MODE": "enforce",
                              "MCP_TOKEN_OTEL_GUARD_MAX_RESPONSE_TOKENS": "5000",
                              "MCP_TOKEN_OTEL_GUARD_SESSION_HARD_LIMIT": "true",
                              "MCP_TOKEN_OTEL_GUARD_ANNOTATE_META": "yes"})
    assert config.guard.mode == "enforce" and config.guard.max_response_tokens == 5000
    assert config.guard.session_hard_limit is True and config.guard.annotate_meta is True
    keys = env_keys()
    for key in ("mode", "max_response_tokens", "session_hard_limit", "annotate_meta", "session_warning_note",
                "rate_limit", "calls_per_minute", "max_chain_depth", "model", "pricing", "tools"):
        assert keys[f"MCP_TOKEN_OTEL_GUARD_{key.upper()}"] == ("guard", key)
    assert keys["MCP_TOKEN_OTEL_GUARD_PADDING_ACTION"] == ("guard", "padding", "action")


def test_env_mappings_for_tools_and_pricing() -> None:
    config = load_config(env={
        "MCP_TOKEN_OTEL_GUARD_MODE": "observe",
        "MCP_TOKEN_OTEL_GUARD_TOOLS": '{"read_*": {max_response_tokens: 20000, mode: enforce}}',
        "MCP_TOKEN_OTEL_GUARD_PRICING": "{my-model: 4.5}",
        "MCP_TOKEN_OTEL_GUARD_MODEL": "my-model",
    })
    assert config.guard.tools == {"read_*": ToolGuard(mode="enforce", max_response_tokens=20000)}
    # A user's table extends the documented defaults.
    assert config.guard.pricing["my-model"] == 4.5 and config.guard.pricing["gpt-5.5"] == DEFAULT_PRICING["gpt-5.5"]
    assert GuardEngine(config.guard).cost_usd(2_000_000) == pytest.approx(9.0)


def test_yaml_file_with_bare_off_globs_and_padding(tmp_path: Path) -> None:
    path = tmp_path / "guard.yaml"
    path.write_text(
        "guard:\n"
        "  mode: off\n"                      # YAML 1.1 reads this as false
        "  max_response_tokens: 8000\n"
        "  tools:\n"
        "    read_*: {max_response_tokens: 20000}\n"
        "    read_secret: {mode: enforce, padding_action: strip}\n"
        "    noisy_*: {mode: off}\n"
        "  padding: {action: strip, min_invisible_chars: 3}\n"
        "  pricing: {gpt-5.5: 3}\n"
    )
    guard = load_config(path, env={}).guard
    assert guard.mode == "off" and guard.tools["noisy_*"].mode == "off"
    assert guard.padding.action == "strip" and guard.padding.min_invisible_chars == 3
    assert guard.pricing["gpt-5.5"] == 3.0
    # An exact name wins over a glob; a glob applies to the names it matches; others get the section's values.
    assert resolve_tool(guard, "read_secret").mode == "enforce"
    assert resolve_tool(guard, "read_secret").max_response_tokens == 8000
    assert resolve_tool(guard, "read_file").max_response_tokens == 20000
    assert resolve_tool(guard, "write_file").max_response_tokens == 8000
    # A tool override turning a guard on makes the engine active although the section says off.
    assert GuardEngine(guard).active is True


def test_config_round_trips_through_plain_data() -> None:
    config = config_from_dict({"guard": {"mode": "enforce", "tools": {"a*": {"annotate_meta": True}},
                                         "model": "gpt-5.4"}})
    assert config_from_dict(config_as_dict(config)) == config
    assert config_as_dict(Config())["guard"]["mode"] == "off"


@pytest.mark.parametrize(
    ("data", "message"),
    [({"guard": {"mode": "on"}}, "config key 'guard.mode': expected one of off, observe, enforce, got 'on'"),
     ({"guard": {"mode": "block"}}, "config key 'guard.mode': expected one of off, observe, enforce"),
     ({"guard": {"max_response_tokens": -1}},
      "config key 'guard.max_response_tokens': expected a non-negative integer (0 turns the limit off), got -1"),
     ({"guard": {"max_response_tokens": "lots"}}, "config key 'guard.max_response_tokens': expected an integer"),
     ({"guard": {"session_hard_limit": "yes please"}},
      "config key 'guard.session_hard_limit': expected true or false"),
     ({"guard": {"calls_per_minute": 0}}, "config key 'guard.calls_per_minute': expected a positive integer"),
     ({"guard": {"padding": {"action": "delete"}}},
      "config key 'guard.padding.action': expected one of notice, strip, got 'delete'"),
     ({"guard": {"padding": {"min_compression_ratio": 2}}},
      "config key 'guard.padding.min_compression_ratio': expected a number in (0, 1]"),
     ({"guard": {"pricing": {"gpt-5.5": "cheap"}}}, "config key 'guard.pricing.gpt-5.5': expected a number"),
     ({"guard": {"pricing": {"gpt-5.5": -1}}},
      "guard.pricing.gpt-5.5: expected a non-negative number (USD per million input tokens)"),
     ({"guard": {"pricing": [1, 2]}}, "config key 'guard.pricing': expected a mapping, got list"),
     ({"guard": {"model": "gpt-9"}}, "guard.model: expected a model named in guard.pricing"),
     ({"guard": {"tools": {"read_*": {"max_tokens": 5}}}},
      "unknown config key 'guard.tools.read_*.max_tokens'"),
     ({"guard": {"tools": {"read_*": {"mode": "strict"}}}},
      "config key 'guard.tools.read_*.mode': expected one of off, observe, enforce, got 'strict'"),
     ({"guard": {"tools": {"read_*": 5}}}, "config key 'guard.tools.read_*': expected a mapping, got int"),
     ({"guard": {"tools": {3: {}}}}, "config key 'guard.tools': expected names as keys, got 3"),
     ({"guard": {"max_respose_tokens": 5}},
      "unknown config key 'guard.max_respose_tokens' (did you mean 'max_response_tokens'?)")],
)
def test_bad_guard_config_names_key_and_expectation(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert message in str(info.value)


def test_bad_env_values_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"'guard.mode': expected one of off, observe, enforce, got 'enforcing'"):
        load_config(env={"MCP_TOKEN_OTEL_GUARD_MODE": "enforcing"})
    with pytest.raises(ConfigError, match=r"'guard.max_response_tokens': expected an integer, got 'big'"):
        load_config(env={"MCP_TOKEN_OTEL_GUARD_MAX_RESPONSE_TOKENS": "big"})
    with pytest.raises(ConfigError, match=r"'guard.tools': expected a mapping, got str"):
        load_config(env={"MCP_TOKEN_OTEL_GUARD_TOOLS": "read_*"})


def test_settings_built_in_code_are_checked_too() -> None:
    with pytest.raises(ValueError, match=r"guard.mode: expected one of off, observe, enforce, got 'x'"):
        GuardSettings(mode="x")
    with pytest.raises(ValueError, match=r"guard.max_response_tokens: expected a non-negative integer"):
        GuardSettings(max_response_tokens=True)  # a bool is not a count
    with pytest.raises(ValueError, match=r"guard.tools.<tool>.mode: expected one of"):
        ToolGuard(mode="x")


def test_spill_is_off_by_default_and_set_from_file_or_environment() -> None:
    guard = load_config(env={}).guard
    assert (guard.spill, guard.spill_ttl, guard.spill_max_bytes, guard.spill_page_tokens) == (False, 300.0, 64 << 20, 0)
    assert guard.spills is False and resolve_tool(guard, "t").spill is False
    config = load_config(env={"MCP_TOKEN_OTEL_GUARD_MODE": "enforce",
                              "MCP_TOKEN_OTEL_GUARD_MAX_RESPONSE_TOKENS": "5000", "MCP_TOKEN_OTEL_GUARD_SPILL": "1",
                              "MCP_TOKEN_OTEL_GUARD_SPILL_TTL": "90",
                              "MCP_TOKEN_OTEL_GUARD_SPILL_MAX_BYTES": "1e6",
                              "MCP_TOKEN_OTEL_GUARD_SPILL_PAGE_TOKENS": "2000"})
    guard = config.guard
    assert (guard.spill, guard.spill_ttl, guard.spill_max_bytes, guard.spill_page_tokens) == (True, 90.0, 10**6, 2000)
    assert guard.spills and resolve_tool(guard, "read_file").spill is True
    # Pages never exceed the cap of the tool that was cut; 0 means the cap itself.
    assert (guard.spill_page_size(5000), guard.spill_page_size(1500)) == (2000, 1500)
    assert GuardSettings(mode="enforce", max_response_tokens=800, spill=True).spill_page_size(800) == 800
    assert config_from_dict(config_as_dict(config)) == config


def test_spill_per_tool_opt_out_and_opt_in() -> None:
    guard = config_from_dict({"guard": {"mode": "enforce", "max_response_tokens": 5000, "spill": True,
                                        "tools": {"read_secret": {"spill": False}}}}).guard
    assert resolve_tool(guard, "read_secret").spill is False and resolve_tool(guard, "read_file").spill is True
    # Only one tool enforces a cap, and only it spills: the section's spill: true is satisfied by it.
    guard = config_from_dict({"guard": {"mode": "observe", "spill": True,
                                        "tools": {"read_*": {"mode": "enforce", "max_response_tokens": 4000}}}}).guard
    assert guard.spills and resolve_tool(guard, "read_file").spill and resolve_tool(guard, "read_file").enforce
    # A tool opting in on its own while the section stays off.
    guard = config_from_dict({"guard": {"mode": "enforce", "max_response_tokens": 5000,
                                        "tools": {"read_*": {"spill": True}}}}).guard
    assert guard.spills and resolve_tool(guard, "read_file").spill and not resolve_tool(guard, "search").spill


@pytest.mark.parametrize(
    ("data", "message"),
    [({"guard": {"spill": True}}, "config key guard.spill: expected guard.mode: enforce and a response cap "
                                  "(guard.max_response_tokens above 0), in the section or in one of guard.tools, got "
                                  "mode 'off' and cap 0"),
     ({"guard": {"spill": True, "mode": "enforce"}}, "guard.spill: expected guard.mode: enforce and a response cap"),
     ({"guard": {"spill": True, "mode": "observe", "max_response_tokens": 5000}},
      "got mode 'observe' and cap 5000"),
     # The one tool that could spill has opted out.
     ({"guard": {"spill": True, "mode": "observe", "tools": {"read_*": {"mode": "enforce", "max_response_tokens": 9,
                                                                          "spill": False}}}},
      "config key guard.spill: expected guard.mode: enforce"),
     ({"guard": {"mode": "enforce", "tools": {"read_*": {"spill": True}}}},
      "config key guard.tools.read_*.spill: expected the tool's mode to be enforce and its response cap above 0, got "
      "mode 'enforce' and cap 0"),
     ({"guard": {"spill": "yes please"}}, "config key 'guard.spill': expected true or false"),
     ({"guard": {"spill_ttl": 0}}, "config key 'guard.spill_ttl': expected a positive number of seconds, got 0.0"),
     ({"guard": {"spill_ttl": "soon"}}, "config key 'guard.spill_ttl': expected a number"),
     ({"guard": {"spill_max_bytes": 0}}, "config key 'guard.spill_max_bytes': expected a positive integer"),
     ({"guard": {"spill_page_tokens": -5}},
      "config key 'guard.spill_page_tokens': expected a non-negative integer (0: the response cap of the tool that "
      "was cut), got -5"),
     ({"guard": {"tools": {"a": {"spill": 3}}}}, "config key 'guard.tools.a.spill': expected true or false")],
)
def test_bad_spill_config_names_the_key(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert message in str(info.value)


def test_spill_settings_built_in_code_are_checked_too() -> None:
    with pytest.raises(ValueError, match=r"guard.spill: expected guard.mode: enforce"):
        GuardSettings(spill=True)
    with pytest.raises(ValueError, match=r"guard.spill_ttl: expected a positive number of seconds"):
        GuardSettings(spill_ttl=-1)
    with pytest.raises(ValueError, match=r"guard.tools.x.spill: expected the tool's mode to be enforce"):
        GuardSettings(max_response_tokens=10, tools={"x": ToolGuard(spill=True)})
