import os
import socket
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, settings

# "ci" (the default): derandomized, so every run tries the same examples and a test cannot pass
# on one machine and fail on another. "long" (HYPOTHESIS_PROFILE=long): many random examples,
# to look for new counterexamples on demand.
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="session")
def _manifests_follow_their_schema():
    """Every packed-directory manifest the suite writes is checked against the format's JSON
    Schema (``tokpack/packed/manifest.schema.json``) as it is written (by the one writer of
    manifests, ``tokpack._io.manifest.write_manifest``)."""
    import jsonschema

    from tokpack._io import manifest as _manifest
    from tokpack.packed import format as _format

    validator = jsonschema.Draft202012Validator(_format.manifest_schema())
    write = _manifest.write_manifest

    def checked(out_dir, manifest):
        if manifest.get("format") == _format.FORMAT:
            validator.validate(manifest)
        write(out_dir, manifest)

    _manifest.write_manifest = checked
    yield
    _manifest.write_manifest = write


@pytest.fixture
def s3_endpoint():
    """A local S3 endpoint (moto's server, on a free port): its URL."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint):
    """A pyarrow S3 file system for the local endpoint, with a fresh bucket ``tokpack-test``;
    tasks get the file system (credentials included) pickled."""
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(
        endpoint_override=s3_endpoint.split("://", 1)[1],
        scheme="http",
        access_key="tokpack",
        secret_key="tokpack",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    fs.create_dir("tokpack-test")
    return fs


@pytest.fixture(scope="session")
def gcs_endpoint():
    """A local Google Cloud Storage endpoint (gcp-storage-emulator in a child process, in
    memory, with the bucket ``tokpack-test``): its ``host:port``."""
    pytest.importorskip("gcp_storage_emulator", reason="gcp-storage-emulator is not installed")
    for _ in range(3):  # a free port taken by another process meanwhile: another port
        proc, port = _start_gcs_emulator()
        if proc is not None:
            break
    else:
        raise RuntimeError("the GCS emulator did not start")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait()


def _start_gcs_emulator():
    """(the emulator's process, its port), or (None, port) when it exited before serving."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gcp_storage_emulator", "start", "--host=127.0.0.1"]
        + [f"--port={port}", "--in-memory", "--default-bucket=tokpack-test"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    return None, port


@pytest.fixture
def gcs(gcs_endpoint):
    """A pyarrow GCS file system for the local endpoint (anonymous), with the bucket
    ``tokpack-test``. ``gcs_uri(gcs_endpoint, key)`` names a key of it as a ``gs://`` URI."""
    import datetime

    import pyarrow.fs as pafs

    return pafs.GcsFileSystem(
        anonymous=True,
        scheme="http",
        endpoint_override=gcs_endpoint,
        project_id="tokpack",
        retry_time_limit=datetime.timedelta(seconds=5),
    )


def gcs_uri(endpoint: str, key: str) -> str:
    """``gs://`` URI of ``key`` ("bucket/path") on the local endpoint: pyarrow takes the
    endpoint and the credentials from the URI itself."""
    return f"gs://anonymous@{key}?scheme=http&endpoint_override={endpoint}&retry_limit_seconds=5"


@pytest.fixture(params=["s3", "gcs"])
def store(request):
    """The pyarrow file system of a local S3 endpoint, then of a local GCS one, each with the
    bucket ``tokpack-test``."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def s3_server(s3, s3_endpoint):
    """``(the pyarrow S3 file system of the local endpoint, "host:port")``."""
    return s3, s3_endpoint.split("://", 1)[1]


@pytest.fixture
def s3_env(s3, s3_endpoint, monkeypatch, tmp_path):
    """``s3://`` URIs resolve to the local endpoint (the AWS environment variables), and
    tokpack's caches are a fresh directory."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "tokpack")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "tokpack")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("TOKPACK_CACHE_DIR", str(tmp_path / "tokpack-cache"))
    return s3
