"""The hard split (chapter 01, `t2t_course.models.hard_split`): `hard_split` against the nested-list reference
(tests/support/split_reference.py: a hard split is a soft split with the kernel its stride and no padding) and
against `soft_split`, and the messages of `hard_split` and `PatchEmbed` for bad input."""
import random

import pytest
import torch

from t2t_course.models.hard_split import hard_split, PatchEmbed
from t2t_course.models.soft_split import soft_split

from tests.support.split_reference import ref_soft_split


@pytest.mark.parametrize("seed", range(3))
def test_hard_split_matches_reference_and_soft_split(seed):
    rng = random.Random(100 + seed)
    for _ in range(30):
        ph, pw = rng.randint(1, 5), rng.randint(1, 5)
        B, C, H, W = rng.randint(1, 2), rng.randint(1, 3), ph * rng.randint(1, 4), pw * rng.randint(1, 4)
        img = torch.randn(B, C, H, W)
        expected = ref_soft_split(img, ph, pw, ph, pw, 0, 0)  # a hard split is a soft split with k = stride, p = 0
        assert torch.equal(hard_split(img, (ph, pw)), expected)
        assert torch.equal(soft_split(img, (ph, pw), (ph, pw), 0), hard_split(img, (ph, pw)))
        if ph == pw: assert torch.equal(hard_split(img, ph), soft_split(img, ph, ph, 0))


@pytest.mark.parametrize("call, message", [
    (lambda: hard_split(torch.randn(1, 3, 30, 32), 16), "does not divide the image size 30 x 32"),
    (lambda: hard_split(torch.randn(1, 3, 32, 32), 0), "patch_size must be positive"),
    (lambda: hard_split(torch.randn(32, 32), 16), "must be a 4-D batch"),
    (lambda: PatchEmbed(30, 16), "does not divide img_size"),
    (lambda: PatchEmbed(32, 16, in_chans=3)(torch.randn(1, 4, 32, 32)), "expected 3 input channels, got 4"),
])
def test_bad_input_messages(call, message):
    with pytest.raises(ValueError) as e: call()
    assert message in str(e.value)


def test_type_errors():
    with pytest.raises(TypeError, match="must be a torch.Tensor, got ndarray"): hard_split(torch.zeros(1, 1, 2, 2).numpy(), 1)
