"""API keys: hashed storage, constant-time lookup, config loading."""

from __future__ import annotations

import json

import pytest

from framespool.producers.auth import (
    ApiKeys,
    TenantPolicy,
    key_id_of,
    new_key,
    record_for,
    record_to_config,
    token_from_headers,
)


def test_new_keys_authenticate_to_their_tenant_and_user():
    token, record = new_key("acme", "alice")
    keys = ApiKeys([record], {"acme": TenantPolicy(("enterprise", "free"), "enterprise")})
    p = keys.authenticate(token)
    assert (p.tenant, p.user, p.key_id) == ("acme", "alice", record.key_id)
    assert p.policy.tier == "enterprise"
    assert token not in repr(record) and record.digest != token.encode()


@pytest.mark.parametrize("bad", ["", None, "nope", "x" * 1000])
def test_unknown_or_malformed_tokens_are_refused(bad):
    token, record = new_key("acme")
    assert ApiKeys([record]).authenticate(bad) is None


def test_wrong_secret_with_a_known_id_is_refused():
    token, record = new_key("acme")
    key_id, secret = token.split(".", 1)
    wrong = secret[:-1] + ("x" if secret[-1] != "x" else "y")  # one in 64 secrets ends in "x"
    assert wrong != secret
    assert ApiKeys([record]).authenticate(f"{key_id}.{wrong}") is None


def test_config_with_hashed_and_plain_keys(tmp_path):
    token, record = new_key("acme", "alice")
    config = {
        "tenants": {"acme": {"tiers": ["paid", "free"]}, "globex": {}},
        "keys": [
            record_to_config(record),
            {"key": "dev-bob", "tenant": "globex", "user": "bob"},
            {**record_to_config(record_for("gone.key", "acme")), "disabled": True},
        ],
    }
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(config))
    keys = ApiKeys.from_config(str(path))
    assert keys.authenticate(token).policy.tiers == ("paid", "free")
    bob = keys.authenticate("dev-bob")
    assert bob.tenant == "globex" and bob.policy.tiers == ("free",)
    assert keys.authenticate("gone.key") is None
    assert "dev-bob" not in repr(vars(keys))  # plain keys are hashed at load
    assert key_id_of("dev-bob") != "dev-bob"


def test_config_errors_are_explained():
    with pytest.raises(ValueError, match="default_tier"):
        ApiKeys.from_config({"tenants": {"a": {"tiers": ["free"], "default_tier": "paid"}}})
    with pytest.raises(ValueError, match="no tenant"):
        ApiKeys.from_config({"keys": [{"key": "k"}]})
    r = record_for("same.one", "a")
    with pytest.raises(ValueError, match="duplicate"):
        ApiKeys([r, r])


def test_token_from_headers():
    assert token_from_headers({"Authorization": "Bearer abc"}) == "abc"
    assert token_from_headers({"Authorization": "bearer abc "}) == "abc"
    assert token_from_headers({"X-API-Key": "k"}) == "k"
    assert token_from_headers({"Authorization": "Basic Zm9v"}) is None
