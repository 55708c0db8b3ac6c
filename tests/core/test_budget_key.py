"""Budget keys: the ordered sources of budget.key, the first present wins; the facts of a wire message."""

from __future__ import annotations

import pytest

from mcp_token_otel.core.budget_key import (
    DEFAULT_BUDGET_KEY,
    KeySource,
    MessageFacts,
    bounded_key_value,
    choose_budget_key,
    client_identity,
    parse_baggage,
    parse_key_sources,
)
from mcp_token_otel.core.labels import server_label_name

DEFAULT = parse_key_sources(DEFAULT_BUDGET_KEY)


def test_default_sources_are_session_then_conversation_baggage_then_principal() -> None:
    assert [s.spec for s in DEFAULT] == ["session", "baggage:gen_ai.conversation.id", "principal"]


def test_parse_names_the_entry_that_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"budget\.key\[1\]: unknown key source 'cookie'"):
        parse_key_sources(["session", "cookie"])
    with pytest.raises(ValueError, match=r"budget\.key\[0\]: baggage needs a name"):
        parse_key_sources(["baggage"])
    with pytest.raises(ValueError, match=r"budget\.key\[0\]: session takes no name"):
        parse_key_sources(["session:x"])
    with pytest.raises(ValueError, match=r"budget\.key: expected a list"):
        parse_key_sources("session")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"budget\.key\[0\]"):
        parse_key_sources([""])


def test_parse_normalises_and_drops_repeats() -> None:
    sources = parse_key_sources(["Session", "header:X-Conversation-Id", "session", "meta:conv"])
    assert sources == (KeySource("session"), KeySource("header", "x-conversation-id"), KeySource("meta", "conv"))


def test_session_wins_when_present_and_is_the_session_id_itself() -> None:
    facts = MessageFacts(session="abc", params={"_meta": {"baggage": "gen_ai.conversation.id=c1"}})
    assert choose_budget_key(DEFAULT, facts) == "abc"


def test_baggage_in_meta_keys_a_sessionless_message() -> None:
    facts = MessageFacts(params={"name": "t", "_meta": {"baggage": "other=1,gen_ai.conversation.id=conv-42"}})
    assert choose_budget_key(DEFAULT, facts) == "baggage:gen_ai.conversation.id=conv-42"


def test_baggage_header_when_meta_has_none_and_percent_decoding() -> None:
    facts = MessageFacts(params={"name": "t"}, headers={"baggage": "gen_ai.conversation.id=a%20b"})
    assert choose_budget_key(DEFAULT, facts) == "baggage:gen_ai.conversation.id=a b"


def test_principal_then_nothing() -> None:
    assert choose_budget_key(DEFAULT, MessageFacts(principal="user-7")) == "principal=user-7"
    assert choose_budget_key(DEFAULT, MessageFacts(params={"_meta": {"baggage": "x=1"}})) is None
    assert choose_budget_key(DEFAULT, MessageFacts(params="not a mapping")) is None


def test_meta_header_and_client_sources() -> None:
    sources = parse_key_sources(["meta:conversationId", "header:x-conv", "client"])
    numeric = MessageFacts(params={"_meta": {"conversationId": 12}})
    assert choose_budget_key(sources, numeric) == "meta:conversationId=12"
    assert choose_budget_key(sources, MessageFacts(headers={"x-conv": "h"})) == "header:x-conv=h"
    who = client_identity({"name": "agent", "version": "1.2"}, "127.0.0.1:5000")
    assert who == "agent/1.2@127.0.0.1:5000"
    assert choose_budget_key(sources, MessageFacts(client=who)) == "client=agent/1.2@127.0.0.1:5000"
    assert client_identity(None, None) is None
    # Non-scalar meta values are not keys.
    assert choose_budget_key(sources, MessageFacts(params={"_meta": {"conversationId": {"x": 1}}})) is None


def test_long_values_become_a_digest() -> None:
    long = "x" * 4_000
    key = choose_budget_key(DEFAULT, MessageFacts(params={"_meta": {"baggage": f"gen_ai.conversation.id={long}"}}))
    assert key is not None and key.startswith("baggage:gen_ai.conversation.id=sha256:") and len(key) < 120
    assert bounded_key_value("short") == "short"
    assert bounded_key_value("\udcff" * 200).startswith("sha256:")  # lone surrogates do not break the digest


def test_baggage_is_parsed_only_when_reached() -> None:
    class Counting(MessageFacts):
        parsed = 0

        def baggage(self, name: str) -> str | None:
            Counting.parsed += 1
            return super().baggage(name)

    choose_budget_key(DEFAULT, Counting(session="s", params={"_meta": {"baggage": "gen_ai.conversation.id=c"}}))
    assert Counting.parsed == 0


def test_malformed_baggage_is_no_key_not_a_fault() -> None:
    for header in ("=", ",,,", "gen_ai.conversation.id", "\x00\x01", "a=b;c" * 5000):
        facts = MessageFacts(params={"_meta": {"baggage": header}})
        assert choose_budget_key(DEFAULT, facts) is None
    assert parse_baggage("gen_ai.conversation.id=c;prop=1") == {"gen_ai.conversation.id": "c"}
    assert parse_baggage("a=1, gen_ai.conversation.id = c%2Cd ,a=2") == {"a": "1", "gen_ai.conversation.id": "c,d"}
    assert parse_baggage("k=" + "v" * 9000) == {}  # over the W3C limit: not read


def test_malformed_baggage_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG"):
        MessageFacts(params={"_meta": {"baggage": "secret-token-without-equals"}}).baggage("x")
    assert "secret-token" not in caplog.text


@pytest.mark.parametrize(("name", "label"), [
    ("secure-filesystem-server", "secure-filesystem-server"),
    ("Everything Server 2.1.0", "everything-server"),
    ("mcp-server-time v1.2.3", "mcp-server-time"),
    ("my-server@0.9.1-beta.2", "my-server"),
    ("server-2", "server-2"),  # a name, not a version
    ("label-v1", "label-v1"),
    ("1.2.3", "1.2.3"),  # only a version: kept
    ("  Spaced   Name ", "spaced-name"),
])
def test_a_servers_own_name_as_its_label(name: str, label: str) -> None:
    assert server_label_name(name) == label
