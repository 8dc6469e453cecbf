"""Tenants, users and keys by configuration and by ``framespool tenants`` (issue #32):
the default stack's tenants reach every tier, a deployment file's ``[[tenants]]``
reaches the cells and the secrets file, and tenants are added and keys rotated
in a data dir (what a running API reloads: test_api_deployment)."""

from __future__ import annotations

import json

import pytest

from framespool import cli, stack_secrets
from framespool.processors.config_file import (
    admission_config,
    cell_config,
    read_config_file,
    tenant_entries,
)
from framespool.processors.core.config import DEFAULT_TIERS
from framespool.producers.auth import ApiKeys
from framespool.stack import Stack, StackConfig, StackError


def stack_in(tmp_path, config=None, **kw) -> Stack:
    stack = Stack(StackConfig(data_dir=tmp_path, processor_config=config, **kw))
    stack.data_dir.mkdir(parents=True, exist_ok=True)
    deployment = stack.deployment()
    stack.write_processor_config(deployment)
    stack.write_secrets(deployment)
    return stack


def keys_of(tmp_path) -> ApiKeys:
    doc = json.loads((tmp_path / stack_secrets.SECRETS_FILE).read_text())
    return ApiKeys.from_config(doc["auth"])


def test_the_default_stack_has_a_tenant_for_every_tier_and_users_with_their_own_keys(tmp_path):
    stack = stack_in(tmp_path)
    keys = keys_of(tmp_path)
    reachable = {t for policy in keys.tenants.values() for t in policy.tiers}
    assert reachable == {t.name for t in DEFAULT_TIERS}  # interactive and batch included
    assert [k["name"] for k in stack.tenant_keys[:3]] == ["acme", "studio", "hobby"]
    acme = [k for k in stack.tenant_keys if k["name"] == "acme"]
    assert [k["user"] for k in acme] == ["alice", "bob"]
    assert {keys.authenticate(k["api_key"]).user for k in acme} == {"alice", "bob"}
    doc = read_config_file(tmp_path / "processors-config.json")
    assert cell_config(doc).tenant("hobby").max_gpus == 16  # the quota a newcomer sees
    assert admission_config(doc).quota_bound("hobby")
    assert not admission_config(doc).quota_bound("acme")


DEPLOYMENT = """
[[tenants]]
name = "render"
tiers = ["batch", "free"]
weight = 3
max_gpus = 8
max_queued = 50
users = [{ name = "ann", weight = 2 }, "ben"]
"""


def test_a_deployment_files_tenants_reach_the_cells_admission_and_the_keys(tmp_path):
    path = tmp_path / "deploy.toml"
    path.write_text(DEPLOYMENT)
    stack = stack_in(tmp_path / "data", path)
    doc = read_config_file(tmp_path / "data" / "processors-config.json")
    render = cell_config(doc).tenant("render")
    assert (render.weight, render.max_gpus, render.user_weights) == (3.0, 8, (("ann", 2.0),))
    assert admission_config(doc).quota_bound("render")
    policy = keys_of(tmp_path / "data").tenants["render"]
    assert policy.tiers == ("batch", "free") and policy.queue_cap == 50  # max_queued
    assert [(k["name"], k["user"]) for k in stack.tenant_keys] == [
        ("render", "ann"),
        ("render", "ben"),
    ]
    # a restart on the same data dir keeps every key and issues one to a new user
    path.write_text(DEPLOYMENT.replace('"ben"]', '"ben", "cy"]'))
    again = stack_in(tmp_path / "data", path)
    assert [k["api_key"] for k in again.tenant_keys[:2]] == [
        k["api_key"] for k in stack.tenant_keys
    ]
    assert again.tenant_keys[2]["user"] == "cy"


@pytest.mark.parametrize(
    "table, key, says",
    [
        ('name = "x"\ntiers = ["gold"]', "tenants[0].tiers", "not among the scheduler's tiers"),
        ('name = "x"\ntiers = ["paid"]\ndefault_tier = "free"', "tenants[0]", "not one of its"),
        ('name = "x"\nweight = 0', "tenants[0]", "weight must be greater than 0"),
        ('name = "x"\nmax_gpus = -1', "tenants[0]", "max_gpus must be at least 0"),
        ('name = "x"\nusers = ["a", "a"]', "tenants[0]", "distinct"),
        ('name = "x"\nquota = 3', "tenants[0]", "unknown field(s) ['quota']"),
    ],
)
def test_a_bad_tenant_entry_stops_up_naming_the_file_and_the_key(tmp_path, table, key, says):
    path = tmp_path / "deploy.toml"
    path.write_text(f"[[tenants]]\n{table}\n")
    with pytest.raises(StackError) as err:
        Stack(StackConfig(data_dir=tmp_path / "data", processor_config=path)).deployment()
    assert str(path) in str(err.value) and key in str(err.value) and says in str(err.value)
    assert not (tmp_path / "data").exists()  # refused before anything was written


def test_tenants_add_list_and_rotate_key(tmp_path, capsys):
    stack_in(tmp_path)
    data = ["--data-dir", str(tmp_path)]
    assert (
        cli.main(["tenants", "add", "newco", "--tiers", "paid,free", "--user", "ann"] + data) == 0
    )
    assert "newco/ann: key fsk" in capsys.readouterr().out
    keys = keys_of(tmp_path)
    issued = stack_secrets.read_issued(tmp_path / stack_secrets.KEYS_FILE)
    ann = next(k for k in issued if k["name"] == "newco")
    assert keys.authenticate(ann["api_key"]).tenant == "newco"
    assert keys.tenants["newco"].tiers == ("paid", "free")

    assert cli.main(["tenants", "list", "--json"] + data) == 0
    listed = {t["name"]: t for t in json.loads(capsys.readouterr().out)["tenants"]}
    assert set(listed) == {"acme", "studio", "hobby", "newco"}
    assert "webhook_secret" not in json.dumps(listed) and "api_key" not in json.dumps(listed)

    assert cli.main(["tenants", "rotate-key", "newco", "--json"] + data) == 0
    new = json.loads(capsys.readouterr().out)["keys"][0]
    keys = keys_of(tmp_path)
    assert keys.authenticate(ann["api_key"]) is None  # the old key stops at once
    assert keys.authenticate(new["api_key"]).user == "ann"
    issued = stack_secrets.read_issued(tmp_path / stack_secrets.KEYS_FILE)
    assert [k["api_key"] for k in issued if k["name"] == "newco"] == [new["api_key"]]

    # mistakes say what to do
    assert cli.main(["tenants", "add", "newco", "--tiers", "paid"] + data) == 2
    assert "exists already" in capsys.readouterr().err
    assert cli.main(["tenants", "add", "x", "--tiers", "gold"] + data) == 2
    assert "not among the stack's tiers" in capsys.readouterr().err
    assert cli.main(["tenants", "rotate-key", "acme"] + data) == 2
    assert "say which with --user" in capsys.readouterr().err
    assert cli.main(["tenants", "rotate-key", "acme", "--user", "bob"] + data) == 0


def test_tenants_entries_parse_users_by_name_or_table(tmp_path):
    path = tmp_path / "deploy.toml"
    path.write_text(DEPLOYMENT)
    (render,) = tenant_entries(read_config_file(path))
    assert render.user_names() == ("ann", "ben") and render.tier == "batch"
