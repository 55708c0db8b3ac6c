from __future__ import annotations

from pathlib import Path

import pytest

from mcp_token_otel import RiskThresholds, build_policy, load_config
from mcp_token_otel.config import Config, ConfigError, config_as_dict, config_from_dict, env_keys


def test_defaults_without_file_or_env() -> None:
    config = load_config(env={})
    assert config == Config()
    assert config.risk.thresholds == RiskThresholds(1000, 4000, 8000)
    assert (config.budget.context_window, config.budget.warning_ratio, config.budget.exhaustion_ratio) == (
        200_000, 0.75, 0.90)
    assert config.risk.max_overhead_ratio == 0.3 and config.estimator == "default"


def test_yaml_file_and_env_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("estimator: chars/4\nrisk:\n  thresholds: {low: 10, medium: 20, high: 30}\n"
                    "budget:\n  context_window: 1000\n")
    config = load_config(path, env={"MCP_TOKEN_OTEL_BUDGET_WARNING_RATIO": "0.5",
                                    "MCP_TOKEN_OTEL_RISK_THRESHOLDS_HIGH": "40"})
    assert config.estimator == "chars/4"
    assert config.risk.thresholds == RiskThresholds(10, 20, 40)
    assert config.budget.context_window == 1000 and config.budget.warning_ratio == 0.5
    # the file can also come from the environment
    assert load_config(env={"MCP_TOKEN_OTEL_CONFIG": str(path)}).budget.context_window == 1000
    policy = build_policy(config)
    assert policy.estimator("abcdefgh") == 2 and policy.thresholds.high == 40


def test_every_key_has_an_env_variable() -> None:
    keys = env_keys()
    assert keys["MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW"] == ("budget", "context_window")
    assert keys["MCP_TOKEN_OTEL_RISK_THRESHOLDS_LOW"] == ("risk", "thresholds", "low")
    assert len(keys) == len(set(keys.values()))


@pytest.mark.parametrize(
    ("data", "message"),
    [({"budgt": {}}, "unknown config key 'budgt' (did you mean 'budget'?)"),
     ({"budget": {"context_windw": 5}}, "unknown config key 'budget.context_windw' (did you mean 'context_window'?)"),
     ({"budget": {"context_window": "big"}}, "config key 'budget.context_window': expected an integer, got 'big'"),
     ({"budget": {"context_window": True}}, "config key 'budget.context_window': expected an integer"),
     ({"budget": {"context_window": -5}}, "config key 'budget.context_window': expected a positive integer"),
     ({"budget": {"warning_ratio": 1.5}}, "config key 'budget.warning_ratio': expected a number in (0, 1]"),
     ({"budget": {"warning_ratio": 0.95}}, "budget.warning_ratio: expected less than budget.exhaustion_ratio"),
     ({"risk": {"thresholds": {"low": 5000}}}, "risk.thresholds: expected strictly increasing"),
     ({"risk": {"thresholds": [1, 2, 3]}}, "config key 'risk.thresholds': expected a mapping"),
     ({"risk": {"thresholds": {"low": "x"}}}, "config key 'risk.thresholds.low': expected an integer"),
     ({"risk": {"max_overhead_ratio": 0}}, "config key 'risk.max_overhead_ratio': expected a number in (0, 1]"),
     ({"estimator": "gpt"}, "config key 'estimator': expected one of default, chars/4"),
     ({"risk": 3}, "config key 'risk': expected a mapping, got int"),
     ({"prometheus": {"port": 70000}}, "config key 'prometheus.port': expected a port number from 0 to 65535"),
     ({"prometheus": {"tls_cert_file": "c.pem"}}, "prometheus.tls_cert_file: expected together with"),
     ({"prometheus": {"basic_auth_username": "u"}}, "prometheus.basic_auth_username: expected together with"),
     ({"spans": {"capture_content": "yes"}}, "config key 'spans.capture_content': expected true or false")],
)
def test_bad_config_names_key_and_expectation(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert message in str(info.value)


def test_bad_files_and_env(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("budget: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(bad, env={})
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        load_config(bad, env={})
    with pytest.raises(ConfigError, match="unknown environment variable MCP_TOKEN_OTEL_BUDGET_WINDOW"):
        load_config(env={"MCP_TOKEN_OTEL_BUDGET_WINDOW": "5"})
    with pytest.raises(ConfigError, match=r"'budget\.context_window': expected an integer, got 'lots'"):
        load_config(env={"MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW": "lots"})
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty, env={}) == Config()


def test_round_trip_through_plain_data() -> None:
    config = config_from_dict({"budget": {"context_window": 5000}})
    assert config_from_dict(config_as_dict(config)) == config


def test_string_keys_from_the_environment_stay_text_and_secrets_are_never_echoed() -> None:
    config = load_config(env={"MCP_TOKEN_OTEL_PROMETHEUS_BASIC_AUTH_USERNAME": "true",
                              "MCP_TOKEN_OTEL_PROMETHEUS_BASIC_AUTH_PASSWORD": "12345678",
                              "MCP_TOKEN_OTEL_PROMETHEUS_HOST": "0x1F"})
    assert config.prometheus.basic_auth_password == "12345678" and config.prometheus.basic_auth_username == "true"
    assert config.prometheus.host == "0x1F"
    with pytest.raises(ConfigError) as info:
        config_from_dict({"prometheus": {"basic_auth_username": "u", "basic_auth_password": 12345678}})
    assert "12345678" not in str(info.value) and "<hidden>" in str(info.value)
    shown = config_as_dict(config, hide_secrets=True)
    assert shown["prometheus"]["basic_auth_password"] == "<hidden>"
    assert config_as_dict(config)["prometheus"]["basic_auth_password"] == "12345678"


# --- hostile input: one ConfigError naming the file or key, never a traceback, never a secret ---------------


def test_invalid_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"\xff\xfe budget: 1\n")
    with pytest.raises(ConfigError, match=r"is not valid UTF-8 \(first bad byte at offset 0\)"):
        load_config(bad, env={})


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000,  # a sequence 100,000 deep
     "".join(" " * i + f"k{i}:\n" for i in range(5000)),  # a block mapping 5,000 deep
     "budget:\n  context_window: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n"],  # deep under a real key
)
def test_deeply_nested_file_is_a_config_error(tmp_path: Path, text: str) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text(text)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(deep, env={})


def test_deeply_nested_env_value_is_rejected_by_name_in_one_short_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW": "[" * 100_000})
    message = str(info.value)
    assert "'budget.context_window': expected an integer" in message
    assert "\n" not in message and len(message) < 300
    # a list or mapping where a scalar belongs is text, rejected by the type check
    with pytest.raises(ConfigError, match=r"expected an integer, got '\[1, 2\]' \(str\)"):
        load_config(env={"MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW": "[1, 2]"})


@pytest.mark.parametrize(
    "text",
    ['prometheus:\n  basic_auth_username: u\n  basic_auth_password: "s3cr3t-pw\n  port: [\n',
     "prometheus:\n  basic_auth_password: 's3cr3t-pw\n",
     "prometheus:\n  basic_auth_password: s3cr3t-pw: x\n",
     "prometheus:\n\tbasic_auth_password: s3cr3t-pw\n",
     "prometheus: {basic_auth_password: s3cr3t-pw\n",
     "prometheus:\n  basic_auth_password: !!python/name:s3cr3t-pw x\n",
     "prometheus:\n  basic_auth_password: *s3cr3t-pw\n"],
)
def test_yaml_syntax_errors_never_echo_the_file(tmp_path: Path, text: str) -> None:
    bad = tmp_path / "secret.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(bad, env={})
    message = str(info.value)
    assert "s3cr3t" not in message and "\n" not in message
    assert message.startswith(f"config file {str(bad)!r}")


def test_set_up_variables_are_not_configuration_keys() -> None:
    """scripts/bootstrap, scripts/run and scripts/test read MCP_TOKEN_OTEL_VENV and MCP_TOKEN_OTEL_PIN; exported,
    they must not break the loader. Every prefixed name the scripts use is either a set-up name or a key."""
    import re

    from mcp_token_otel.config import ENV_CONFIG_FILE, SETUP_VARIABLES

    scripts = Path(__file__).resolve().parent.parent / "scripts"
    used = {m for f in scripts.iterdir() if f.is_file() for m in re.findall(r"MCP_TOKEN_OTEL_[A-Z_]+", f.read_text())}
    assert {"MCP_TOKEN_OTEL_VENV", "MCP_TOKEN_OTEL_PIN"} <= used
    assert used <= SETUP_VARIABLES | set(env_keys()) | {ENV_CONFIG_FILE}
    assert not SETUP_VARIABLES & set(env_keys())  # no set-up name shadows a key
    assert load_config(env={"MCP_TOKEN_OTEL_PIN": "mcp<2", "MCP_TOKEN_OTEL_VENV": "/tmp/v"}) == Config()


def test_readme_configuration_table_lists_every_key() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    table = doc[doc.index("## Every key"):]
    missing = [f"{'.'.join(path)} ({name})" for name, path in env_keys().items()
               if f"| `{'.'.join(path)}` |" not in table or f"`{name}`" not in table]
    assert not missing, f"README configuration table lacks: {missing}"


def test_boolean_environment_switches_accept_1_and_0() -> None:
    on = load_config(env={"MCP_TOKEN_OTEL_PROMETHEUS_ENABLED": "1", "MCP_TOKEN_OTEL_GUARD_ANNOTATE_META": "1"})
    assert on.prometheus.enabled is True and on.guard.annotate_meta is True
    assert load_config(env={"MCP_TOKEN_OTEL_PROMETHEUS_ENABLED": "0"}).prometheus.enabled is False
    with pytest.raises(ConfigError, match=r"'prometheus\.enabled': expected true or false"):
        load_config(env={"MCP_TOKEN_OTEL_PROMETHEUS_ENABLED": "2"})


def test_budget_key_propagate_and_idle_timeout() -> None:
    default = Config().budget
    assert default.key == ["session", "baggage:gen_ai.conversation.id", "principal"]
    assert default.propagate is False and default.idle_timeout == 1800.0
    config = load_config(env={"MCP_TOKEN_OTEL_BUDGET_KEY": "header:X-Conversation-Id, session",
                              "MCP_TOKEN_OTEL_BUDGET_PROPAGATE": "1",
                              "MCP_TOKEN_OTEL_BUDGET_IDLE_TIMEOUT": "90"})
    assert config.budget.key == ["header:X-Conversation-Id", "session"]
    assert config.budget.propagate is True and config.budget.idle_timeout == 90.0
    assert config_from_dict({"budget": {"key": ["client"]}}).budget.key == ["client"]
    assert config_from_dict(config_as_dict(config)) == config


@pytest.mark.parametrize(
    ("key", "message"),
    [(["session", "bogus"], "budget.key[1]: unknown key source 'bogus'"),
     (["baggage"], "budget.key[0]: baggage needs a name"),
     (["session:x"], "budget.key[0]: session takes no name"),
     ([], "budget.key: expected at least one key source"),
     ([3], "config key 'budget.key': expected a list of names"),
     ({"a": 1}, "config key 'budget.key': expected a list of names")],
)
def test_bad_budget_key_names_the_entry(key: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict({"budget": {"key": key}})
    assert message in str(info.value)


def test_repeat_window_defaults_to_a_minute_and_zero_turns_it_off() -> None:
    assert Config().metrics.repeat_window == 60.0
    config = load_config(env={"MCP_TOKEN_OTEL_METRICS_REPEAT_WINDOW": "0"})
    assert config.metrics.repeat_window == 0
    assert config_from_dict({"metrics": {"repeat_window": 15}}).metrics.repeat_window == 15
    with pytest.raises(ConfigError, match=r"config key 'metrics.repeat_window': expected a number of seconds >= 0"):
        config_from_dict({"metrics": {"repeat_window": -1}})


def test_image_tokens_reaches_the_policy_and_names_the_key() -> None:
    assert build_policy(Config()).image_tokens == "area"
    config = load_config(env={"MCP_TOKEN_OTEL_IMAGE_TOKENS": "tiles"})
    assert build_policy(config).image_tokens == "tiles"
    with pytest.raises(ConfigError, match=r"'image_tokens': expected one of area, tiles, patches, base64"):
        load_config(env={"MCP_TOKEN_OTEL_IMAGE_TOKENS": "pixels"})


def test_instrumentation_sides_default_env_and_errors() -> None:
    assert load_config(env={}).instrumentation.sides == ["client", "server"]
    assert load_config(env={"MCP_TOKEN_OTEL_INSTRUMENTATION_SIDES": "server"}).instrumentation.sides == ["server"]
    both = load_config(env={"MCP_TOKEN_OTEL_INSTRUMENTATION_SIDES": "client, server"})
    assert both.instrumentation.sides == ["client", "server"]
    assert config_from_dict({"instrumentation": {"sides": ["client"]}}).instrumentation.sides == ["client"]
    config = config_from_dict({"instrumentation": {"sides": "server"}})
    assert config_from_dict(config_as_dict(config)) == config
    for bad in ("proxy", [], "", ["server", "serve"]):
        with pytest.raises(ConfigError, match=r"config key 'instrumentation\.sides': expected a non-empty list of "
                                              r"client, server"):
            config_from_dict({"instrumentation": {"sides": bad}})
    with pytest.raises(ConfigError, match=r"config key 'instrumentation\.sides': expected a list of names"):
        config_from_dict({"instrumentation": {"sides": 3}})
    with pytest.raises(ConfigError, match=r"'instrumentation\.sides'.*got \['clients'\]"):
        load_config(env={"MCP_TOKEN_OTEL_INSTRUMENTATION_SIDES": "clients"})
