"""Hard and soft splits written from their definition (tests/models/test_soft_split.py, test_hard_split.py): pure Python
index arithmetic over nested lists, no torch reshapes, no unfold, so the reference shares no code with the library."""
import torch


def ref_size(n, k, s, p):
    "Windows along an axis, counted one by one."
    count, start = 0, -p
    while start + k <= n + p:
        count, start = count + 1, start + s
    return count


def ref_soft_split(img, kh, kw, sh, sw, ph, pw):
    "Nested-list soft split: for each window (row-major), features in (channel, row, column) order."
    B, C, H, W = img.shape
    px = img.tolist()
    Ho, Wo = ref_size(H, kh, sh, ph), ref_size(W, kw, sw, pw)
    out = []
    for b in range(B):
        seq = []
        for r in range(Ho):
            for q in range(Wo):
                feats = []
                for c in range(C):
                    for i in range(kh):
                        for j in range(kw):
                            y, x = r * sh - ph + i, q * sw - pw + j
                            feats.append(px[b][c][y][x] if 0 <= y < H and 0 <= x < W else 0.0)
                seq.append(feats)
        out.append(seq)
    return torch.tensor(out, dtype=img.dtype).reshape(B, Ho * Wo, C * kh * kw)
