import os

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
    Schema (``tokpack/manifest.schema.json``) as it is written."""
    import jsonschema

    from tokpack import _format

    validator = jsonschema.Draft202012Validator(_format.manifest_schema())
    write = _format.write_manifest

    def checked(out_dir, manifest):
        if manifest.get("format") == _format.FORMAT:
            validator.validate(manifest)
        write(out_dir, manifest)

    _format.write_manifest = checked
    yield
    _format.write_manifest = write


@pytest.fixture
def s3_server():
    """A local S3 endpoint (moto's server, on a free port) with a fresh bucket ``tokpack-test``:
    ``(pyarrow S3 file system of it, "host:port")``."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    import pyarrow.fs as pafs

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    fs = pafs.S3FileSystem(
        endpoint_override=f"{host}:{port}",
        scheme="http",
        access_key="tokpack",
        secret_key="tokpack",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    fs.create_dir("tokpack-test")
    yield fs, f"{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server):
    """The pyarrow S3 file system of :func:`s3_server` (tasks get it, credentials included,
    pickled)."""
    return s3_server[0]
