"""The S3 adapter of the shared-snapshot port (MinIO in compose, moto in tests): a
head changes by a conditional PutObject (``If-Match``/``If-None-Match``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from framespool.processors.shared_snapshots.heads import NO_CHANGE, HeadStore
from framespool.processors.shared_snapshots.port import SharedStoreError


class S3SharedSnapshots(HeadStore):
    """Objects in ``bucket`` under ``prefix``; heads change by conditional PutObject."""

    def __init__(
        self,
        bucket: str,
        endpoint_url: str | None = None,
        *,
        prefix: str = "snapshots",
        region_name: str | None = None,
        client: Any = None,
    ) -> None:
        import boto3

        self.bucket = bucket
        self.prefix = prefix.strip("/") or "snapshots"
        self._client = client or boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region_name or os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        )

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def create_bucket(self) -> None:
        """Create the bucket if missing (tests, the embedded stack)."""
        from botocore.exceptions import ClientError

        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self._client.create_bucket(Bucket=self.bucket)

    @staticmethod
    def _code(exc: Exception) -> str:
        return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))

    def _get(self, key: str) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError

        try:
            got = self._client.get_object(Bucket=self.bucket, Key=key)
            return got["Body"].read(), got["ETag"]
        except ClientError as exc:
            if self._code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise SharedStoreError(f"cannot read s3://{self.bucket}/{key}: {exc}") from exc
        except Exception as exc:  # connection refused, timeouts: botocore's other errors
            raise SharedStoreError(f"cannot read s3://{self.bucket}/{key}: {exc}") from exc

    def _update_head(self, key: str, change: Callable[[dict | None], Any]) -> Any:
        from botocore.exceptions import ClientError

        for _ in range(50):
            got = self._get(key)
            head, etag = (None, None) if got is None else (json.loads(got[0]), got[1])
            new, result = change(head)
            if new is NO_CHANGE:
                return result
            condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
            try:
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=json.dumps(new).encode(),
                    ContentType="application/json",
                    **condition,
                )
                return result
            except ClientError as exc:
                # another writer got in between: re-read and re-decide
                if self._code(exc) in ("PreconditionFailed", "ConditionalRequestConflict", "412"):
                    continue
                raise SharedStoreError(f"cannot write s3://{self.bucket}/{key}: {exc}") from exc
            except Exception as exc:
                raise SharedStoreError(f"cannot write s3://{self.bucket}/{key}: {exc}") from exc
        raise SharedStoreError(f"s3://{self.bucket}/{key}: too much contention on the head")

    def _read_head(self, key: str) -> dict | None:
        got = self._get(key)
        return None if got is None else json.loads(got[0])

    def _put_body(self, key: str, data: bytes) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except Exception as exc:
            raise SharedStoreError(f"cannot write s3://{self.bucket}/{key}: {exc}") from exc

    def _get_body(self, key: str) -> bytes | None:
        got = self._get(key)
        return None if got is None else got[0]

    def _delete_body(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except Exception:  # garbage left behind costs space, never correctness
            pass
