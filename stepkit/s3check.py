"""A quick S3 pre-flight check: a misconfigured store fails a step with exit 2 and a message naming the setting.

Without it, a step whose storage Secret lacks the endpoint or the keys spends about 12 s
in botocore's retries and then exits 1 with a traceback. :func:`preflight` looks at the
step's argv, and for each ``s3://`` bucket it names makes ONE request (ListObjectsV2,
``MaxKeys=1``, under the first prefix seen; the same permission the steps need to find
their inputs and markers) with short timeouts and no retries. Any failure raises
:class:`stepkit.step.StepError` naming what to fix:

=============================================  ==============================================
what went wrong                                the message names
=============================================  ==============================================
no credentials found                           ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
                                               (the storage Secret) or a pod identity
endpoint URL malformed                         ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``)
endpoint unreachable / timed out / TLS error   ``AWS_ENDPOINT_URL`` (and ``AWS_CA_BUNDLE``)
keys rejected, access denied                   ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
bucket missing                                 the bucket and the endpoint
wrong region                                   ``AWS_DEFAULT_REGION``
=============================================  ==============================================

Settings are botocore's own (environment, ``~/.aws/config``, web identity, instance
metadata), the same ones s3fs uses, so the check sees what the step would see.
A bucket is checked once per process. ``HOUSE_S3_PREFLIGHT=0`` turns the check off.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from .errors import StepError

#: Seconds for connecting and for reading the one pre-flight response.
TIMEOUT_SECONDS = 5.0

_S3_URI = re.compile(r"s3://([^/\s,;'\"]+)(/[^\s,;'\"]*)?")
_checked: set[str] = set()


def s3_locations(argv: Iterable[str]) -> dict[str, str]:
    """``{bucket: first key prefix}`` of every ``s3://`` URI in ``argv`` (also inside ``--flag=...``)."""
    found: dict[str, str] = {}
    for arg in argv:
        for m in _S3_URI.finditer(str(arg)):
            found.setdefault(m.group(1), (m.group(2) or "").lstrip("/"))
    return found


def _endpoint_setting() -> tuple[str, str | None]:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(name):
            return name, os.environ[name]
    return "AWS_ENDPOINT_URL", None


def _secret_hint() -> str:
    return (
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (in Kubernetes: keys of the storage Secret, "
        "HOUSE_STORAGE_SECRET, default 'house-storage-credentials') or give the pod an IAM identity"
    )


def check_bucket(bucket: str, prefix: str = "", *, timeout: float = TIMEOUT_SECONDS) -> str:
    """One ListObjectsV2 on ``s3://bucket/prefix``; the endpoint used, or :class:`StepError`."""
    import botocore.session  # only steps that touch S3 pay for botocore
    from botocore import exceptions as bex
    from botocore.config import Config

    setting, endpoint = _endpoint_setting()
    where = f"{setting}={endpoint}" if endpoint else f"{setting} unset, so AWS's own endpoint"
    uri = f"s3://{bucket}/{prefix}"
    config = Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1, "mode": "standard"})
    session = botocore.session.get_session()
    try:
        client = session.create_client("s3", config=config)
    except ValueError as exc:  # botocore: "Invalid endpoint: ..."
        raise StepError(
            f"S3 storage {uri}: {setting}={endpoint!r} is not a valid endpoint URL ({exc}); "
            f"set it to the S3 service URL, e.g. http://minio.storage:9000"
        ) from None
    except bex.BotoCoreError as exc:
        raise StepError(f"S3 storage {uri}: invalid S3 client settings ({exc})") from None
    used = client.meta.endpoint_url
    try:
        client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except (bex.NoCredentialsError, bex.PartialCredentialsError) as exc:
        raise StepError(f"S3 storage {uri}: no usable credentials ({exc}); {_secret_hint()}") from None
    except bex.SSLError as exc:
        raise StepError(
            f"S3 storage {uri}: TLS error talking to {used} ({where}): {exc}; "
            f"check {setting} (http vs https) or set AWS_CA_BUNDLE"
        ) from None
    except (
        bex.EndpointConnectionError,
        bex.ConnectTimeoutError,
        bex.ReadTimeoutError,
        bex.ConnectionClosedError,
        bex.HTTPClientError,
    ) as exc:
        raise StepError(
            f"S3 storage {uri}: cannot reach the S3 endpoint {used} ({where}): {exc}; "
            f"set {setting} to a reachable S3 service URL"
        ) from None
    except bex.ClientError as exc:
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchBucket",) or status == 404:
            raise StepError(
                f"S3 storage {uri}: bucket {bucket!r} does not exist at {used} ({where}); "
                "create it or fix HOUSE_STORAGE_ROOT"
            ) from None
        if (
            code
            in (
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "AccessDenied",
                "InvalidToken",
                "ExpiredToken",
                "AllAccessDisabled",
            )
            or status == 403
        ):
            key = os.environ.get("AWS_ACCESS_KEY_ID", "")
            shown = f" (AWS_ACCESS_KEY_ID={key[:4]}...)" if key else ""
            raise StepError(
                f"S3 storage {uri}: {used} refused the request with {code or status}{shown}; "
                f"check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and the bucket policy"
            ) from None
        if (
            code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException")
            or status == 301
        ):
            region = err.get("Region") or exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(
                "x-amz-bucket-region", "?"
            )
            raise StepError(
                f"S3 storage {uri}: bucket is in region {region}; set AWS_DEFAULT_REGION={region}"
            ) from None
        raise StepError(f"S3 storage {uri}: {used} answered {code or status}: {err.get('Message', exc)}") from None
    return used


def preflight(argv: Iterable[str], *, timeout: float = TIMEOUT_SECONDS) -> None:
    """Check each S3 bucket named in ``argv`` once per process (see the module docstring)."""
    if os.environ.get("HOUSE_S3_PREFLIGHT", "1").lower() in ("0", "false", "no"):
        return
    for bucket, prefix in s3_locations(argv).items():
        if bucket not in _checked:
            check_bucket(bucket, prefix, timeout=timeout)
            _checked.add(bucket)
