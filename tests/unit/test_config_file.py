"""One config loader (framespool.configfile) for the processors' file, the stack's
settings and the API key table: every error names the file, the key and what was
expected."""

from __future__ import annotations

import dataclasses
import json

import pytest

from framespool import configfile
from framespool.bootstrap import api_keys, stack_secrets
from framespool.processors import config_file
from framespool.processors.core import CellConfig
from framespool.producers.auth import ApiKeys


def error(call, *args, **kwargs) -> configfile.ConfigError:
    with pytest.raises(configfile.ConfigError) as caught:
        call(*args, **kwargs)
    return caught.value


# -- the processors' file ---------------------------------------------------------------
def test_a_processor_config_error_names_the_file_the_key_and_what_was_expected(tmp_path):
    path = tmp_path / "fs.toml"
    path.write_text('[scheduler]\n[[scheduler.tenants]]\nname = "acme"\nweight = "heavy"\n')
    e = error(config_file.load_cell_config, path)
    assert (e.file, e.key) == (str(path), "scheduler.tenants[0].weight")
    assert e.detail == "expected a number, got 'heavy'"
    assert (
        str(e) == f"config file {path}: scheduler.tenants[0].weight: expected a number, got 'heavy'"
    )
    # read once, built later (as the processors' entry point does): still the file
    doc = config_file.read_config_file(path)
    assert error(config_file.cell_config, doc).file == str(path)


@pytest.mark.parametrize(
    "section, key, says",
    [
        ('tiers = []', "scheduler", "tiers: name at least one tier"),
        ("backfill_depth = -5", "scheduler", "backfill_depth must be at least 0, got -5"),
        ("overrun_factor = 0.0", "scheduler", "overrun_factor must be greater than 0"),
        ("heartbeat_timeout_s = nan", "scheduler", "heartbeat_timeout_s must be at least 0"),
        ("straggler_ratio = 1.5", "scheduler", "straggler_ratio must be a ratio from 0 to 1"),
        ('retries = [["hung", -1]]', "scheduler", "retries['hung'] must be at least 0"),
        (
            '[[scheduler.tenants]]\nname = "acme"\nweight = 0.0',
            "scheduler.tenants[0]",
            "tenant 'acme': weight must be greater than 0, got 0.0",
        ),
        (
            '[[scheduler.tenants]]\nname = "acme"\nweight = inf',
            "scheduler.tenants[0]",
            "tenant 'acme': weight must be a finite number greater than 0",
        ),
        (
            '[[scheduler.tenants]]\nname = "acme"\nmax_gpus = -8',
            "scheduler.tenants[0]",
            "tenant 'acme': max_gpus must be at least 0",
        ),
        (
            '[[scheduler.tenants]]\nname = "acme"\nuser_weights = [["ann", 0.0]]',
            "scheduler.tenants[0]",
            "user_weights['ann'] must be greater than 0",
        ),
        (
            '[[scheduler.tiers]]\nname = "paid"\nweight = -1.0\nrank = 1\nsla_wait_s = 60.0',
            "scheduler.tiers[0]",
            "tier 'paid': weight must be greater than 0",
        ),
        (
            '[[scheduler.tiers]]\nname = ""\nweight = 1.0\nrank = 1\nsla_wait_s = 60.0',
            "scheduler.tiers[0]",
            "a tier needs a name",
        ),
    ],
)
def test_values_no_cell_can_run_by_are_refused_with_file_and_key(tmp_path, section, key, says):
    # a weight of 0 divides the fair share by 0, no tier rejects every job, a
    # negative depth or budget is a typo: the scheduler would start and misbehave
    path = tmp_path / "fs.toml"
    path.write_text(f"[scheduler]\n{section}\n")
    e = error(config_file.load_cell_config, path)
    assert (e.file, e.key) == (str(path), key)
    assert says in e.detail, e.detail


@pytest.mark.parametrize(
    "name",
    [f.name for f in dataclasses.fields(CellConfig) if f.init and f.type in ("int", "float")],
)
def test_every_numeric_knob_refuses_nan_and_negatives(name):
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError, match=name):
            CellConfig(**{name: bad})
    CellConfig(**{name: 1})  # and takes a plain positive value


def test_the_shipped_and_simulator_configs_pass_the_checks():
    from framespool.processors.sim.policies import POLICIES

    CellConfig()
    for policy in POLICIES.values():
        policy.configure(CellConfig(), {"acme": 1.0, "zeta": 3.0})


def test_unknown_fields_sections_and_bad_syntax_name_the_file(tmp_path):
    path = tmp_path / "fs.json"
    path.write_text(json.dumps({"admission": {"cels": ["cell-0"]}}))
    e = error(config_file.load_admission_config, path)
    assert e.file == str(path) and e.key == "admission"
    assert "unknown field(s) ['cels']" in e.detail and "cells" in e.detail
    path.write_text(json.dumps({"schedular": {}}))
    e = error(config_file.read_config_file, path)
    assert e.file == str(path) and "'schedular'" in e.detail and "'scheduler'" in e.detail
    bad = tmp_path / "bad.toml"
    bad.write_text("[scheduler\n")
    e = error(config_file.read_config_file, bad)
    assert e.file == str(bad) and "not valid TOML" in e.detail
    e = error(config_file.read_config_file, tmp_path / "missing.toml")
    assert "cannot read config file" in str(e) and "missing.toml" in str(e)


def test_a_valid_file_builds_the_cores_config(tmp_path):
    path = tmp_path / "fs.toml"
    path.write_text(
        '[scheduler]\nheartbeat_timeout_s = 10\nretries = { node_lost = 5 }\n'
        '[[scheduler.tenants]]\nname = "acme"\nweight = 2\n'
    )
    config = config_file.load_cell_config(path)
    assert isinstance(config, CellConfig) and config.heartbeat_timeout_s == 10.0
    assert config.tenant("acme").weight == 2.0 and config.retries == (("node_lost", 5),)
    admission = config_file.load_admission_config(path)
    assert admission.tiers == tuple(t.name for t in config.tiers)


# -- the stack's settings and the API key table ---------------------------------------------
def secrets_file(tmp_path, doc) -> None:
    (tmp_path / "stack-secrets.json").write_text(json.dumps(doc))


def test_the_stack_settings_and_key_table_use_the_same_loader(tmp_path):
    path = tmp_path / "stack-secrets.json"
    secrets_file(tmp_path, {"auth": {"keys": []}})
    e = error(stack_secrets, tmp_path)
    assert (e.file, e.key) == (str(path), "signing_secret")
    assert e.detail == "missing: expected a string"
    secrets_file(tmp_path, {"auth": {}, "signing_secret": "x", "s3": {"bucket": 7}})
    e = error(stack_secrets, tmp_path)
    assert (e.file, e.key, e.detail) == (str(path), "s3.bucket", "expected a string, got 7")
    keys = [{"key": "k1", "tenant": "acme"}, {"key": "k2", "tenant": ["acme"]}]
    secrets_file(tmp_path, {"auth": {"keys": keys}, "signing_secret": "x"})
    e = error(api_keys, stack_secrets(tmp_path))
    assert (e.file, e.key) == (str(path), "auth.keys[1].tenant")
    assert e.detail == "expected a string, got ['acme']"
    keys[1]["tenant"] = "acme"
    secrets_file(tmp_path, {"auth": {"keys": keys}, "signing_secret": "x"})
    assert api_keys(stack_secrets(tmp_path)).authenticate("k2").tenant == "acme"


def test_api_key_files_name_the_file_and_the_key(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text('[tenants.acme]\ntiers = ["free"]\ndefault_tier = "paid"\n')
    e = error(ApiKeys.from_config, path)
    assert (e.file, e.key) == (str(path), "tenants.acme.default_tier")
    assert "'paid' is not in its tiers" in e.detail
    path.write_text('[[keys]]\nkey = "k"\n')
    e = error(ApiKeys.from_config, path)
    assert (e.file, e.key) == (str(path), "keys[0].tenant") and "no tenant" in e.detail
    path.write_text('[[keys]]\ntenant = "acme"\nid = "x"\nsalt = "zz"\nsha256 = "00"\n')
    e = error(ApiKeys.from_config, path)
    assert (e.file, e.key) == (str(path), "keys[0]") and "hex" in e.detail


def test_there_is_one_error_type_and_it_is_still_a_value_error():
    assert config_file.ConfigError is configfile.ConfigError
    assert issubclass(configfile.ConfigError, ValueError)
