"""The S3 adapter of the artifact-store port (S3, MinIO, moto) through boto3.

Above ``multipart_threshold`` an upload is multipart with a SHA-256 checksum per
part; the whole object's SHA-256 is kept in its user metadata
(:data:`SHA256_METADATA`) and checked on every download. Signed URLs are
presigned GETs (SigV4).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from framespool.agents.artifacts.digests import check_download, sha256_file
from framespool.agents.artifacts.port import (
    MULTIPART_THRESHOLD,
    SHA256_METADATA,
    ArtifactError,
    ArtifactNotFound,
    InvalidKey,
    StoredArtifact,
    validate_key,
)


class S3Store:
    """S3 (or MinIO, moto) through boto3: multipart above ``multipart_threshold``
    with SHA-256 checksums per part, the whole-object digest in user metadata."""

    put_empty_inline = False  # every write is a network call: callers use a worker thread

    def __init__(
        self,
        bucket: str,
        endpoint_url: str | None = None,
        *,
        region_name: str | None = None,
        client: Any = None,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        multipart_chunksize: int = MULTIPART_THRESHOLD,
        max_concurrency: int = 4,
    ) -> None:
        import boto3
        import botocore.config
        from boto3.s3.transfer import TransferConfig

        self.bucket = bucket
        self._client = client or boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region_name or os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            # presigned URLs with SigV4 (botocore would presign SigV2 in us-east-1)
            config=botocore.config.Config(signature_version="s3v4"),
        )
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_concurrency=max_concurrency,
        )

    @property
    def client(self) -> Any:
        return self._client

    def create_bucket(self) -> None:
        """Create the bucket if missing (tests, the embedded stack)."""
        from botocore.exceptions import ClientError

        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self._client.create_bucket(Bucket=self.bucket)

    def key_of(self, key_or_uri: str) -> str:
        prefix = f"s3://{self.bucket}/"
        if key_or_uri.startswith(prefix):
            return validate_key(key_or_uri[len(prefix) :])
        if "://" in key_or_uri:
            raise InvalidKey(f"{key_or_uri!r} is not an object of bucket {self.bucket!r}")
        return validate_key(key_or_uri)

    def put_file(self, key: str, path: Path | str) -> StoredArtifact:
        key = validate_key(key)
        digest, size = sha256_file(path)
        try:
            self._client.upload_file(
                str(path),
                self.bucket,
                key,
                Config=self._transfer,
                ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": {SHA256_METADATA: digest}},
            )
        except Exception as e:
            raise ArtifactError(f"upload of {path} to s3://{self.bucket}/{key} failed: {e}") from e
        return StoredArtifact(f"s3://{self.bucket}/{key}", digest, size)

    def put_bytes(self, key: str, data: bytes) -> StoredArtifact:
        """An object the agent itself made (a builtin's output), in one PUT."""
        key = validate_key(key)
        digest = hashlib.sha256(data).hexdigest()
        try:
            self._client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=data,
                ChecksumAlgorithm="SHA256",
                Metadata={SHA256_METADATA: digest},
            )
        except Exception as e:
            raise ArtifactError(
                f"upload of {len(data)} bytes to s3://{self.bucket}/{key} failed: {e}"
            ) from e
        return StoredArtifact(f"s3://{self.bucket}/{key}", digest, len(data))

    def get_file(self, key_or_uri: str, dest_path: Path | str) -> StoredArtifact:
        from botocore.exceptions import ClientError

        key = self.key_of(key_or_uri)
        dest = Path(dest_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=key)
            self._client.download_file(
                self.bucket,
                key,
                str(tmp),
                Config=self._transfer,
                ExtraArgs={"ChecksumMode": "ENABLED"},
            )
        except ClientError as e:
            tmp.unlink(missing_ok=True)
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise ArtifactNotFound(f"no object s3://{self.bucket}/{key}") from e
            raise ArtifactError(f"download of s3://{self.bucket}/{key} failed: {e}") from e
        digest, size = sha256_file(tmp)
        check_download(key, digest, head.get("Metadata", {}).get(SHA256_METADATA), tmp)
        os.replace(tmp, dest)
        return StoredArtifact(f"s3://{self.bucket}/{key}", digest, size)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=self.key_of(key))
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise ArtifactError(f"cannot check s3://{self.bucket}/{key}: {e}") from e

    def delete(self, key_or_uri: str) -> None:
        """Remove an object (S3's DELETE answers success for an absent key too)."""
        key = self.key_of(key_or_uri)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except Exception as e:
            raise ArtifactError(f"delete of s3://{self.bucket}/{key} failed: {e}") from e

    def served(self) -> None:
        """None: its signed URLs are presigned GETs the bucket serves, not the API."""
        return None

    def signed_url(self, key: str, expires_s: int = 3600, *, tenant: str = "") -> str:
        """A presigned GET (SigV4; the bucket's URLs name no tenant, the key names the job)."""
        return self._client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self.key_of(key)},
            ExpiresIn=int(expires_s),
        )
