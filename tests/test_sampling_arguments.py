"""sample's argument checks, and those of the parameter packer the tests build their cases with."""

import math

import numpy as np
import pytest

from tests.sampling_cases import pack_sampling_params
from tinyvllm.kernels.sampling import MAX_PARTS, MAX_VOCAB, ROUND, sample, sample_workspace_shape


def _valid_inputs(rows=2, vocab=3 * ROUND):
    logits = np.zeros((rows, vocab), np.float32)
    params = pack_sampling_params([1.0] * rows, [-1] * rows, [1.0] * rows, range(rows), range(rows))
    shape = sample_workspace_shape(rows, vocab)
    return logits, params, np.zeros(rows, np.int32), np.zeros(shape, np.float32), np.zeros(shape, np.int32)


@pytest.mark.parametrize(
    "change, name",
    [
        (lambda a: a.__setitem__(0, a[0].astype(np.float64)), "logits"),
        (lambda a: a.__setitem__(0, a[0][:, ::2]), "logits"),
        (lambda a: a.__setitem__(0, a[0][0]), "logits"),
        (lambda a: a.__setitem__(0, np.zeros((2, 0), np.float32)), "logits"),
        (lambda a: a.__setitem__(0, np.zeros((1, MAX_VOCAB), np.float32)), "logits"),
        (lambda a: a.__setitem__(1, a[1][:1]), "temperature"),
        (lambda a: a.__setitem__(2, a[2].astype(np.int64)), "top_k"),
        (lambda a: a.__setitem__(3, a[3].astype(np.float64)), "top_p"),
        (lambda a: a.__setitem__(4, a[4].astype(np.int64)), "seeds"),
        (lambda a: a.__setitem__(5, a[5].astype(np.int32)), "offsets"),
        (lambda a: a.__setitem__(6, np.zeros(3, np.int32)), "out"),
        (lambda a: a.__setitem__(7, a[7].astype(np.float64)), "part_values"),
        (lambda a: a.__setitem__(7, a[7][:1]), "part_values"),
        (lambda a: a.__setitem__(7, np.zeros((2, MAX_PARTS + 1), np.float32)), "part_values"),
        (lambda a: a.__setitem__(7, np.zeros((2, 2 * a[7].shape[1]), np.float32)[:, ::2]), "part_values"),
        (lambda a: a.__setitem__(7, a[7][0]), "part_values"),
        (lambda a: a.__setitem__(8, a[8].astype(np.int64)), "part_indices"),
        (lambda a: a.__setitem__(8, a[8][:1]), "part_indices"),
        (lambda a: a.__setitem__(8, a[8].astype(np.float32)), "part_indices"),
    ],
)
def test_sample_rejects_bad_arguments(change, name):
    logits, params, out, part_values, part_indices = _valid_inputs()
    arguments = [logits, *params, out, part_values, part_indices]
    change(arguments)
    with pytest.raises(ValueError, match=name):
        sample(*arguments)


def test_pack_sampling_params_types_and_values():
    packed = pack_sampling_params([0, 0.7], [-1, 50], [1, 0.9], [0, 2**64 - 1], [0, 2**63 - 1])
    assert [a.dtype for a in packed] == [np.float32, np.int32, np.float32, np.uint64, np.int64]
    np.testing.assert_array_equal(packed[1], [-1, 50])
    assert packed[3][1] == 2**64 - 1 and packed[4][1] == 2**63 - 1
    assert packed[2][1] == np.float32(0.9)


@pytest.mark.parametrize(
    "arguments, name",
    [
        (([-0.1], [-1], [1.0], [0], [0]), "temperature"),
        (([math.nan], [-1], [1.0], [0], [0]), "temperature"),
        (([1.0], [0], [1.0], [0], [0]), "top_k"),
        (([1.0], [-2], [1.0], [0], [0]), "top_k"),
        (([1.0], [-1], [0.0], [0], [0]), "top_p"),
        (([1.0], [-1], [1.5], [0], [0]), "top_p"),
        (([1.0], [-1], [1.0], [-1], [0]), "seeds"),
        (([1.0], [-1], [1.0], [2**64], [0]), "seeds"),
        (([1.0], [-1], [1.0], [0], [-1]), "offsets"),
        (([1.0, 1.0], [-1], [1.0], [0], [0]), "one value per row"),
    ],
)
def test_pack_sampling_params_rejects_bad_values(arguments, name):
    with pytest.raises(ValueError, match=name):
        pack_sampling_params(*arguments)
