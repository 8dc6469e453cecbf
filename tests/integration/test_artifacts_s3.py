"""S3Store through the artifact-store contract, against a real S3 API (moto's server)."""

from __future__ import annotations

import boto3
import pytest

from framespool.agents.artifacts.port import output_key
from framespool.agents.artifacts.s3 import S3Store
from tests.support.contracts.artifacts import BIG, ArtifactStoreContract

pytestmark = pytest.mark.integration


@pytest.fixture
def store(s3_endpoint, s3_bucket):
    return S3Store(s3_bucket, endpoint_url=s3_endpoint)


@pytest.fixture
def corrupt(store):
    def _corrupt(key: str) -> None:
        client = store.client
        head = client.head_object(Bucket=store.bucket, Key=key)
        # Other bytes under the same key, keeping the digest recorded at upload.
        client.put_object(
            Bucket=store.bucket, Key=key, Body=b"flipped bits", Metadata=head["Metadata"]
        )

    return _corrupt


class TestS3Store(ArtifactStoreContract):
    pass


def test_large_upload_is_multipart_with_sha256_checksums(store, tmp_path):
    src = tmp_path / "big"
    src.write_bytes(b"\x07" * BIG)
    stored = store.put_file(output_key("job-mp", 1, "video.bin"), src)
    head = store.client.head_object(
        Bucket=store.bucket, Key=store.key_of(stored.uri), ChecksumMode="ENABLED"
    )
    assert head["ETag"].strip('"').endswith("-2")  # two 8 MiB parts
    assert "ChecksumSHA256" in head
    assert head["Metadata"]["sha256"] == stored.sha256


def test_create_bucket_is_idempotent(s3_endpoint):
    store = S3Store("framespool-idempotent-bucket", endpoint_url=s3_endpoint)
    store.create_bucket()
    store.create_bucket()
    names = [
        b["Name"] for b in boto3.client("s3", endpoint_url=s3_endpoint).list_buckets()["Buckets"]
    ]
    assert "framespool-idempotent-bucket" in names


def test_presigned_url_downloads_the_object(store, tmp_path):
    import urllib.request

    src = tmp_path / "o"
    src.write_bytes(b"gif89a...")
    key = output_key("job-url", 1, "out.gif")
    store.put_file(key, src)
    with urllib.request.urlopen(store.signed_url(key, expires_s=60), timeout=10) as resp:
        assert resp.read() == b"gif89a..."
