"""The soft split and re-structurization (chapter 02, `t2t_course.models.soft_split`): soft_split, soft_split_fast,
soft_split_size, restructurize, the T2T chain of grids and the coverage of each pixel against an independent reference
(tests/support/split_reference.py), and the messages for bad input."""
import math, random

import pytest
import torch

from t2t_course.core import to_2tuple
from t2t_course.models.soft_split import (soft_split, soft_split_fast, soft_split_size, restructurize, SoftSplit, t2t_grid_sizes,
                                   coverage, T2T_SOFT_SPLITS)

from tests.support.split_reference import ref_size, ref_soft_split


def random_config(rng):
    "A random valid (image, kernel, stride, padding) with non-square images and kernels."
    H, W = rng.randint(1, 13), rng.randint(1, 13)
    ph, pw = rng.randint(0, 3), rng.randint(0, 3)
    kh, kw = rng.randint(1, H + 2 * ph), rng.randint(1, W + 2 * pw)
    sh, sw = rng.randint(1, 5), rng.randint(1, 5)
    B, C = rng.randint(1, 2), rng.randint(1, 3)
    return (B, C, H, W), (kh, kw), (sh, sw), (ph, pw)


@pytest.mark.parametrize("seed", range(4))
def test_soft_split_matches_reference(seed):
    rng = random.Random(seed)
    for _ in range(60):
        shape, (kh, kw), (sh, sw), (ph, pw) = random_config(rng)
        img = torch.randn(*shape, generator=torch.Generator().manual_seed(rng.randint(0, 10**6)))
        expected = ref_soft_split(img, kh, kw, sh, sw, ph, pw)
        got = soft_split(img, (kh, kw), (sh, sw), (ph, pw))
        assert got.shape == expected.shape, (shape, kh, kw, sh, sw, ph, pw)
        assert torch.equal(got, expected), (shape, kh, kw, sh, sw, ph, pw)
        assert soft_split_size(shape[-2:], (kh, kw), (sh, sw), (ph, pw)) == (ref_size(shape[2], kh, sh, ph),
                                                                            ref_size(shape[3], kw, sw, pw))
        assert torch.equal(SoftSplit((kh, kw), (sh, sw), (ph, pw))(img), expected)
        assert torch.equal(soft_split_fast(img, (kh, kw), (sh, sw), (ph, pw)), expected)
        channels_last = img.permute(0, 2, 3, 1).contiguous()  # (B, H, W, C), as tokens viewed on their grid
        assert torch.equal(soft_split_fast(channels_last, (kh, kw), (sh, sw), (ph, pw), channels_last=True), expected)
        if kh == kw and sh == sw and ph == pw and shape[2] == shape[3]:
            assert soft_split(img, kh, sh, ph).equal(expected)  # int arguments mean square


def test_soft_split_size_formula_and_int_form():
    rng = random.Random(0)
    for _ in range(500):
        n, p = rng.randint(1, 400), rng.randint(0, 4)
        k, s = rng.randint(1, n + 2 * p), rng.randint(1, 9)
        assert soft_split_size(n, k, s, p) == ref_size(n, k, s, p) == math.floor((n + 2 * p - k) / s) + 1


def test_restructurize_inverts_flattening():
    rng = random.Random(7)
    for _ in range(30):
        B, C, H, W = rng.randint(1, 3), rng.randint(1, 5), rng.randint(1, 9), rng.randint(1, 9)
        fmap = torch.randn(B, C, H, W)
        tokens = torch.tensor([[[fmap[b, c, n // W, n % W].item() for c in range(C)] for n in range(H * W)]
                               for b in range(B)])  # (B, N, C), row-major, built element by element
        assert torch.equal(restructurize(tokens, (H, W)), fmap)
        if H == W: assert torch.equal(restructurize(tokens, H), fmap)


def test_t2t_chain():
    assert T2T_SOFT_SPLITS == ((7, 4, 2), (3, 2, 1), (3, 2, 1))
    assert t2t_grid_sizes(224) == [(56, 56), (28, 28), (14, 14)]
    assert t2t_grid_sizes(384) == [(96, 96), (48, 48), (24, 24)]
    for size in [(200, 320), (97, 64), 33]:
        H, W = to_2tuple(size)
        sizes = []
        for k, s, p in T2T_SOFT_SPLITS:
            H, W = ref_size(H, k, s, p), ref_size(W, k, s, p)
            sizes.append((H, W))
        assert t2t_grid_sizes(size) == sizes
    # walking the chain with tensors gives those grids
    x = torch.randn(1, 3, 50, 70)
    t = soft_split(x, 7, 4, 2)
    (h0, w0), (h1, w1), (h2, w2) = t2t_grid_sizes((50, 70))
    t = soft_split(restructurize(t, (h0, w0)), 3, 2, 1)
    t = soft_split(restructurize(t[..., :8], (h1, w1)), 3, 2, 1)
    assert t.shape == (1, h2 * w2, 8 * 9)


def test_coverage_against_window_count():
    rng = random.Random(3)
    for _ in range(20):
        H, W = rng.randint(1, 12), rng.randint(1, 12)
        p = rng.randint(0, 2); k = rng.randint(1, min(H, W) + 2 * p); s = rng.randint(1, 4)
        cov = coverage((H, W), k, s, p)
        starts_y = [r * s - p for r in range(ref_size(H, k, s, p))]
        starts_x = [q * s - p for q in range(ref_size(W, k, s, p))]
        for y in range(H):
            for x in range(W):
                n = sum(a <= y < a + k for a in starts_y) * sum(a <= x < a + k for a in starts_x)
                assert cov[y, x].item() == n


@pytest.mark.parametrize("call, message", [
    (lambda: soft_split(torch.randn(3, 8, 8), 3, 2, 1), "must be a 4-D batch (B, C, H, W), got shape (3, 8, 8)"),
    (lambda: soft_split(torch.randn(1, 3, 4, 9), 7, 1, 1), "kernel_size 7 is larger than the padded input 6 along the height"),
    (lambda: soft_split(torch.randn(1, 3, 9, 4), 7, 1, 1), "kernel_size 7 is larger than the padded input 6 along the width"),
    (lambda: soft_split(torch.randn(1, 3, 8, 8), 0, 1), "kernel_size must be positive"),
    (lambda: soft_split(torch.randn(1, 3, 8, 8), 3, -2), "stride must be positive"),
    (lambda: soft_split(torch.randn(1, 3, 8, 8), 3, 1, -1), "padding must be >= 0"),
    (lambda: soft_split(torch.randn(1, 3, 8, 8), 2.5, 1), "kernel_size must be an int or a pair of ints"),
    (lambda: soft_split_size(-4, 3, 1), "size must be positive"),
    (lambda: soft_split_size((8, 0), 3, 1), "size must be positive"),
    (lambda: SoftSplit(3, 0), "stride must be positive"),
    (lambda: soft_split_fast(torch.randn(1, 3, 4, 9), 7, 1, 1), "kernel_size 7 is larger than the padded input 6 along the height"),
    (lambda: soft_split_fast(torch.randn(1, 4, 9, 3), 7, 1, 1, channels_last=True), "larger than the padded input 6 along the height"),
    (lambda: soft_split_fast(torch.randn(4, 9, 3), 3, 1), "x must be a 4-D batch"),
    (lambda: restructurize(torch.randn(2, 10, 4), (3, 3)), "cannot re-structurize 10 tokens into a 3 x 3 grid (9 tokens)"),
    (lambda: restructurize(torch.randn(2, 9, 4), 0), "size must be positive"),
    (lambda: restructurize(torch.randn(9, 4), 3), "tokens must be a 3-D tensor (B, N, C)"),
])
def test_bad_input_messages(call, message):
    with pytest.raises(ValueError) as e: call()
    assert message in str(e.value)


def test_type_errors():
    with pytest.raises(TypeError, match="must be a torch.Tensor, got list"): soft_split([[1.]], 1, 1)
