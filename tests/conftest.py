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
    Schema (``tokpack/packed/manifest.schema.json``) as it is written."""
    import jsonschema

    from tokpack.packed import format as _format

    validator = jsonschema.Draft202012Validator(_format.manifest_schema())
    write = _format.write_manifest

    def checked(out_dir, manifest):
        if manifest.get("format") == _format.FORMAT:
            validator.validate(manifest)
        write(out_dir, manifest)

    _format.write_manifest = checked
    yield
    _format.write_manifest = write
