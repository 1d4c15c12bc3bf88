"""Overrides that shrink a registered variant to a few blocks, its widths, heads and block types kept.

Shared by the tests that run every variant (tests/models/test_t2t_vit.py, tests/test_core.py, tests/deploy/test_timm.py): the
blocks of a variant are one code object repeated, so a few of them hold every path a test can take, at a fraction of
the cost of the full depth."""
import torch

from t2t_course.models.t2t_vit import create_model, get_variant


def few_blocks(name:str, blocks:int=2) -> dict:
    "`blocks` blocks instead of the variant's depth; the dense design gets that many blocks over its two stages."
    arch = get_variant(name).arch
    if 'depth' in arch: return dict(depth=blocks)
    if 'block_config' in arch: return dict(block_config=(blocks - blocks // 2, blocks // 2))
    return {}


SIZES = ('embed_dim', 'depth', 'num_heads', 'mlp_ratio', 'growth_rate', 'block_config', 'patch_size')  # numbers only


def design(name:str) -> tuple:
    """What a registered variant's code paths depend on: its model class, the names of its architecture settings and
    every setting that is not a size (tokens_type, block_fn, qkv_bias, ...). Variants of one design run the same code
    at other widths, depths, head counts or image sizes."""
    v = get_variant(name)
    return v.model_cls, tuple(sorted(v.arch)), tuple(sorted((k, repr(x)) for k, x in v.arch.items() if k not in SIZES))


def first_of_each_design(names) -> set:
    "The first name of each design among `names` (the others differ from it only in sizes)."
    firsts = {}
    for n in names: firsts.setdefault(design(n), n)
    return set(firsts.values())


def shapes_only(name:str, **kwargs):
    """The registered model `name` built on the meta device: every parameter and buffer with its shape and no data, no
    weights drawn (for the tests of layouts, configurations and MAC counts; the forward tests build for real)."""
    with torch.device('meta'): return create_model(name, **kwargs)
