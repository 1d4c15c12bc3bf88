"""Overrides that shrink a registered variant to a few blocks, its widths, heads and block types kept.

Shared by the tests that run every variant (test_models, test_fast_paths, test_timm): the blocks of a variant are one
code object repeated, so a few of them hold every path a test can take, at a fraction of the cost of the full depth."""
from t2t_course.models import get_variant


def few_blocks(name:str, blocks:int=2) -> dict:
    "`blocks` blocks instead of the variant's depth; the dense design gets that many blocks over its two stages."
    arch = get_variant(name).arch
    if 'depth' in arch: return dict(depth=blocks)
    if 'block_config' in arch: return dict(block_config=(blocks - blocks // 2, blocks // 2))
    return {}
