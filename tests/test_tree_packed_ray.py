"""Ray refuses tree token shards (their rows are packed as trees by ``tokpack pack`` only),
with the kinds' one refusal, before anything is written."""

import pytest

import tokpack

from .test_tree_packed import corpus, write_tree_shards

pytest.importorskip("ray", reason="ray is not installed: pip install 'tokpack[ray]'")
pytest.importorskip("ray.data", reason="ray[data] is not installed: pip install 'tokpack[ray]'")
import tokpack.ray  # noqa: E402

pytestmark = pytest.mark.ray
if "tree" not in tokpack.kinds.SAMPLE_KINDS:  # until the core's tree kind (h-treepack) lands
    pytest.skip("tokpack pack has no tree kind in this build", allow_module_level=True)


def test_ray_refuses_tree_token_shards(tmp_path):
    shards = write_tree_shards(tmp_path / "trees", corpus(n_grpo=2, n_chats=1), n_files=1)
    with pytest.raises(tokpack.ConfigError, match=r"part-0.parquet holds .*--ray\) does not"):
        tokpack.ray.pack([shards / "part-0.parquet"], tmp_path / "out", 64)
    assert not (tmp_path / "out").exists()
