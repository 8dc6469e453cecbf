"""Pure parts of webhooks: signing, target policy, what to deliver, backoff."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json

import pytest

from framespool.callbacks.targets import (
    PolicyResolver,
    TargetPolicy,
    TargetRefused,
    address_problem,
    check_address,
    check_target,
    check_url,
)
from framespool.projections.jobs import apply, fold
from framespool.projections.webhooks import backoff_delay, delivery_for, sign, verify
from tests.support.projections import lifecycle

SECRET = b"whsec-test"


# -- signing -------------------------------------------------------------------
def test_signature_is_hmac_sha256_of_timestamp_dot_body():
    body = b'{"a":1}'
    expected = hmac.new(SECRET, b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign(SECRET, 1_700_000_000, body) == f"t=1700000000,v1={expected}"


def test_verify_accepts_fresh_untampered_and_rotated_signatures():
    body = b'{"state":"COMPLETED"}'
    header = sign(SECRET, 1_000, body)
    assert verify(SECRET, header, body, now_s=1_100)
    assert not verify(SECRET, header, body + b" ", now_s=1_100)
    assert not verify(b"other", header, body, now_s=1_100)
    assert not verify(SECRET, header, body, now_s=1_000 + 301)  # replayed too late
    assert not verify(SECRET, "t=abc,v1=00", body, now_s=1_000)
    rotated = sign(b"old", 1_000, body) + "," + header.split(",")[1]
    assert verify(SECRET, rotated, body, now_s=1_000)


# -- target policy -------------------------------------------------------------
@pytest.mark.parametrize(
    "url,problem",
    [
        ("https://hooks.example.com/x", ""),
        ("http://hooks.example.com:8080/x?y=1", ""),
        ("ftp://hooks.example.com/x", "scheme"),
        ("https:///nohost", "no host"),
        ("https://user:pw@example.com/", "credentials"),
        ("https://example.com:99999/", "malformed"),
        ("https://example.com/" + "a" * 3000, "longer than"),
    ],
)
def test_check_url(url, problem):
    found = check_url(url)
    assert (problem in found) if problem else found == ""


@pytest.mark.parametrize(
    "address,kind",
    [
        ("8.8.8.8", ""),
        ("2606:4700:4700::1111", ""),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.1.1", "private"),
        ("172.16.0.1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "not globally"),
        ("::ffff:127.0.0.1", "loopback"),
        ("2002:7f00:1::", "loopback"),
        ("fc00::1", "private"),
    ],
)
def test_address_problem(address, kind):
    found = address_problem(address)
    assert (kind in found) if kind else found == ""


def test_check_target_checks_ip_literals_that_no_resolver_sees():
    assert "loopback" in check_target("http://127.0.0.1:8080/hook")
    assert "link-local" in check_target("http://[fe80::1]/hook")
    assert check_target("http://127.0.0.1:8080/hook", TargetPolicy(allow_private=True)) == ""
    assert check_target("https://hooks.example.com/x") == ""


def test_policy_exemptions():
    assert "private" in check_address("intranet", "10.0.0.5")
    assert check_address("intranet", "10.0.0.5", TargetPolicy(allow_private=True)) == ""
    assert (
        check_address("Intranet.", "10.0.0.5", TargetPolicy(allow_hosts=frozenset({"intranet"})))
        == ""
    )
    assert check_address("x", "10.0.0.5", TargetPolicy(allow_networks=("10.0.0.0/24",))) == ""
    assert check_address("x", "10.0.1.5", TargetPolicy(allow_networks=("10.0.0.0/24",))) != ""


class FakeResolver:
    def __init__(self, answers):
        self.answers = answers

    async def resolve(self, host, port=0, family=0):
        return [
            {"hostname": host, "host": a, "port": port, "family": 2, "proto": 0, "flags": 0}
            for a in self.answers
        ]

    async def close(self):
        pass


def test_resolver_refuses_any_private_answer_of_a_public_name():
    async def go(answers, policy=TargetPolicy()):
        return await PolicyResolver(policy, FakeResolver(answers)).resolve("evil.example", 443)

    assert len(asyncio.run(go(["93.184.216.34"]))) == 1
    with pytest.raises(TargetRefused, match="169.254.169.254"):
        asyncio.run(go(["93.184.216.34", "169.254.169.254"]))  # DNS rebinding / multi-answer
    assert asyncio.run(go(["127.0.0.1"], TargetPolicy(allow_private=True)))


# -- what to deliver -----------------------------------------------------------
def test_deliveries_only_on_state_changes_of_jobs_with_callbacks():
    events = lifecycle("j1", progress_steps=3, callback_url="https://example.com/hook")
    view, made = None, []
    for e in events:
        after = apply(view, e)
        d = delivery_for(view, after, e)
        if d:
            made.append(json.loads(d.body))
            assert d.delivery_id == e.event_id and d.url == "https://example.com/hook"
        view = after
    assert [m["state"] for m in made] == ["QUEUED", "ASSIGNED", "RUNNING", "COMPLETED"]
    assert made[-1]["result_url"] == "/v1/jobs/j1/result"
    assert made[1]["previous_state"] == "QUEUED"
    plain = fold(lifecycle("j2"))
    assert delivery_for(None, plain, lifecycle("j2")[-1]) is None


def test_backoff_is_exponential_capped_and_jittered():
    assert backoff_delay(1, 1.0, 300, 1.0) == 1.0
    assert backoff_delay(4, 1.0, 300, 1.0) == 8.0
    assert backoff_delay(20, 1.0, 300, 1.0) == 300
    assert backoff_delay(4, 1.0, 300, 0.5) == 4.0
    assert backoff_delay(4, 1.0, 300, 0.0) == 0.0
