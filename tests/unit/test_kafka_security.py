"""Hostile tenants, item 9 (client side): every Kafka client a process makes
authenticates with the process's own SASL principal when one is configured."""

from __future__ import annotations

import pytest

from framespool.log import kafka


def test_sasl_settings_reach_every_client(monkeypatch, tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("FRAMESPOOL_KAFKA_SASL_USERNAME", "api")
    monkeypatch.setenv("FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE", str(secret))
    monkeypatch.setenv("FRAMESPOOL_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("FRAMESPOOL_KAFKA_SASL_MECHANISM", "PLAIN")
    want = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "api",
        "sasl.password": "s3cret",
    }
    assert kafka.security_settings() == want
    producer = kafka.LogProducer("127.0.0.1:1")
    consumer = kafka.LogConsumer("127.0.0.1:1")
    try:
        for settings in (producer._settings, consumer._settings):
            assert {k: settings[k] for k in want} == want
    finally:
        producer.close(0.1)
        consumer.close()


def test_no_settings_without_a_principal_and_bad_ones_are_named(monkeypatch):
    assert kafka.security_settings({}) == {}
    with pytest.raises(ValueError, match="FRAMESPOOL_KAFKA_SASL_USERNAME='api' without a password"):
        kafka.security_settings({"FRAMESPOOL_KAFKA_SASL_USERNAME": "api"})
    with pytest.raises(ValueError, match="FRAMESPOOL_KAFKA_SASL_MECHANISM"):
        kafka.security_settings(
            {
                "FRAMESPOOL_KAFKA_SASL_USERNAME": "a",
                "FRAMESPOOL_KAFKA_SASL_PASSWORD": "p",
                "FRAMESPOOL_KAFKA_SASL_MECHANISM": "GSSAPI",
            }
        )
    assert (
        kafka.security_settings(
            {"FRAMESPOOL_KAFKA_SASL_USERNAME": "a", "FRAMESPOOL_KAFKA_SASL_PASSWORD": "p"}
        )["security.protocol"]
        == "SASL_SSL"
    )
