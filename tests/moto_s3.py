"""A moto S3 server on 127.0.0.1 for tests whose S3 clients run in other processes (pods, steps)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

ACCESS_KEY = "AKIAMOTOTEST"
SECRET_KEY = "moto-secret/key+test"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def moto_s3(*buckets: str) -> Iterator[str]:
    """Start ``ThreadedMotoServer``, create ``buckets``, yield the endpoint URL; stop at exit."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        # moto keeps its backends per process, shared by every server a test session starts:
        # start from an empty S3 so no test sees another's buckets and objects
        reset(url)
        client = s3_client(url)
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield url
    finally:
        reset(url)
        server.stop()


def reset(url: str) -> None:
    """Empty every moto backend of this process (through the server's reset endpoint)."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=30).read()


def s3_client(url: str):
    import botocore.session

    return botocore.session.get_session().create_client(
        "s3", endpoint_url=url, region_name=REGION, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY
    )


def list_keys(url: str, bucket: str, prefix: str = "") -> list[str]:
    client = s3_client(url)
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return sorted(keys)


def storage_env(url: str) -> dict[str, str]:
    """What the storage Secret holds for this server (and what a step needs)."""
    return {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
    }
