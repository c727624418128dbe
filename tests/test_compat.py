"""The drop-in functions on every example of the token-packing guide
(../shared/seeds/001_575928b77d3930d2.txt) that runs without a model hub."""

import numpy as np
import pytest

import tokpack
from tokpack import concatenate_and_pack, pack_sequences

torch = pytest.importorskip("torch")


def guide_sequences():
    return [
        torch.tensor([1, 2, 3]),
        torch.tensor([4, 5]),
        torch.tensor([6, 7, 8, 9]),
        torch.tensor([10, 11, 12]),
    ]


def test_basic_usage_prints_the_guide_output():
    packed = pack_sequences(guide_sequences(), max_length=8, pad_token_id=0)
    assert isinstance(packed, torch.Tensor) and packed.dtype == torch.int64
    expected = torch.tensor([[1, 2, 3, 4, 5, 0, 0, 0], [6, 7, 8, 9, 10, 11, 12, 0]])
    assert torch.equal(packed, expected)
    assert str(packed) == str(expected)


@pytest.mark.parametrize("max_length", [2048, 4096])
def test_max_length_examples(max_length):
    packed = pack_sequences(guide_sequences(), max_length=max_length, pad_token_id=0)
    assert packed.shape == (1, max_length)
    assert packed[0, :12].tolist() == list(range(1, 13)) and int(packed[0, 12:].sum()) == 0


def test_pad_token_id_example():
    packed = pack_sequences(guide_sequences(), max_length=2048, pad_token_id=32000)
    assert packed[0, 12:].eq(32000).all()


def test_concatenate_and_pack_example():
    input_sequences = [[1, 2, 3], [4, 5, 6, 7]]
    label_sequences = [[-100, 2, 3], [-100, -100, 6, 7]]
    attention_masks = [[1, 1, 1], [1, 1, 1, 1]]
    packed_inputs, packed_labels, packed_masks = concatenate_and_pack(
        input_sequences,
        label_sequences,
        attention_masks,
        max_length=8,
        pad_token_id=0,
        label_pad_id=-100,
    )
    assert isinstance(packed_inputs, np.ndarray)
    assert packed_inputs.tolist() == [[1, 2, 3, 4, 5, 6, 7, 0]]
    assert packed_labels.tolist() == [[-100, 2, 3, -100, -100, 6, 7, -100]]
    assert packed_masks.tolist() == [[1, 1, 1, 1, 1, 1, 1, 0]]


def test_concatenate_and_pack_with_tensors_returns_a_tuple_of_tensors():
    out = concatenate_and_pack(
        [torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6, 7])],
        [torch.tensor([-100, 2, 3]), torch.tensor([-100, -100, 6, 7])],
        [torch.ones(3, dtype=torch.int64), torch.ones(4, dtype=torch.int64)],
        max_length=5,
    )
    assert isinstance(out, tuple) and len(out) == 3
    assert all(isinstance(t, torch.Tensor) for t in out)
    assert out[0].tolist() == [[1, 2, 3, 0, 0], [4, 5, 6, 7, 0]]
    assert out[1].tolist() == [[-100, 2, 3, -100, -100], [-100, -100, 6, 7, -100]]


def test_greedy_in_order_example():
    seqs = [[1] * 1500, [2] * 1000, [3] * 500, [4] * 2000]
    packed = pack_sequences(seqs, max_length=2048, pad_token_id=0)
    assert packed.shape == (3, 2048)
    assert packed[1, :1000].tolist() == [2] * 1000 and packed[1, 1000:1500].tolist() == [3] * 500


def test_boundaries_example():
    packed, boundaries = pack_sequences(
        guide_sequences(), max_length=8, pad_token_id=0, return_boundaries=True
    )
    assert boundaries == [[(0, 3), (3, 5)], [(0, 4), (4, 7)]]
    flat = [packed[r, a:b].tolist() for r, spans in enumerate(boundaries) for a, b in spans]
    assert flat == [s.tolist() for s in guide_sequences()]


def test_packing_with_labels_pattern_keeps_inputs_and_labels_aligned():
    input_ids = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    labels = [[-100, 2, 3], [-100, 5], [-100, -100, 8, 9]]
    packed_inputs = pack_sequences(input_ids, max_length=6, pad_token_id=0)
    packed_labels = pack_sequences(labels, max_length=6, pad_token_id=-100)
    assert packed_inputs.tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 0, 0]]
    assert packed_labels.tolist() == [[-100, 2, 3, -100, 5, -100], [-100, -100, 8, 9, -100, -100]]


def test_model_size_configs_example():
    model_configs = {"7b": 4096, "13b": 4096, "70b": 8192}
    for model_size in model_configs:
        max_length = model_configs[model_size]
        packed = pack_sequences(guide_sequences(), max_length=max_length, pad_token_id=0)
        assert packed.shape == (1, max_length)


def test_overlong_sequences_raise_then_truncation_from_troubleshooting_works():
    max_length = 4
    sequences = guide_sequences() + [torch.tensor([], dtype=torch.int64)]
    with pytest.raises(tokpack.OverlongError, match=r"sequences\[2\] has 4 tokens|truncate"):
        pack_sequences([torch.arange(1, 6)] + sequences, max_length=max_length)
    sequences = [s[:max_length] for s in sequences if len(s) > 0]
    packed = pack_sequences(sequences, max_length=max_length, pad_token_id=0)
    assert packed.tolist() == [[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9], [10, 11, 12, 0]]


def test_memory_issues_chunking_example():
    rng = np.random.default_rng(0)
    sequences = [torch.tensor(rng.integers(1, 100, rng.integers(1, 300))) for _ in range(25_000)]
    chunk_size = 10000
    all_packed = []
    for i in range(0, len(sequences), chunk_size):
        chunk = sequences[i : i + chunk_size]
        packed = pack_sequences(chunk, max_length=2048, pad_token_id=0)
        all_packed.append(packed)
    final = torch.cat(all_packed, dim=0)
    assert final.shape[1] == 2048
    assert int((final != 0).sum()) == sum(len(s) for s in sequences)


def test_complete_training_loop_example():
    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("Config", (), {"pad_token_id": 0})()
            self.emb = torch.nn.Embedding(100, 8)
            self.head = torch.nn.Linear(8, 100)

        def forward(self, input_ids, labels):
            logits = self.head(self.emb(input_ids))
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, 100), labels[:, 1:].reshape(-1), ignore_index=0
            )
            return type("Out", (), {"loss": loss})()

    batch_size = 2

    def train_with_packing(model, sequences, max_length=2048):
        optimizer = torch.optim.AdamW(model.parameters())
        packed = pack_sequences(
            sequences, max_length=max_length, pad_token_id=model.config.pad_token_id
        )
        steps = 0
        for i in range(0, len(packed), batch_size):
            batch = packed[i : i + batch_size]
            outputs = model(batch, labels=batch)
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
        return steps

    assert train_with_packing(TinyLM(), guide_sequences(), max_length=8) == 1


def test_numpy_and_lists_give_numpy():
    out = pack_sequences([np.array([1, 2], dtype=np.int32), [3]], max_length=4)
    assert isinstance(out, np.ndarray) and out.tolist() == [[1, 2, 3, 0]]


def test_mismatched_labels_raise():
    with pytest.raises(tokpack.DataError, match=r"label_sequences\[0\] has 2 entries"):
        concatenate_and_pack([[1, 2, 3]], [[1, 2]], [[1, 1, 1]], max_length=4)
