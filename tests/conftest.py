import os

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
