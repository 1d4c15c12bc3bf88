"""`t2t_course.core`'s switches and size checks (chapter 00).

Every fast path against the readable path it replaces, in one table: forward outputs and every gradient.
A row of `CASES` builds a layer or a model on its fast paths (the default), its inputs, and names the switches
that the readable copy (same weights, a deep copy) turns off: `ALL` is `set_fast_paths(copy, False)`, a tuple
names single switches. Every registered model is a row (from `list_models()`, two of its blocks; at its own depth
with --runslow), so a new variant is compared the moment it is registered. The switches themselves (which function
sets which, and `count_macs` restoring the one it turns off) are tested below the table; `to_2tuple` and `is_static`
on symbolic sizes at the end.
"""
import copy
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn

from t2t_course import create_model, list_models, T2TViT
from t2t_course.core import set_fast_paths
from t2t_course.models.attention import attention, set_fused_attn, Block
from t2t_course.models.t2t_layer import TokenTransformer
from t2t_course.models.performer import TokenPerformer
from t2t_course.models.t2t_module import T2TModule
from t2t_course.models.backbone import count_macs

from tests.support.official_reference import model_grads, perturb_, max_rel_err
from tests.support.variant_sizes import few_blocks

SWITCHES = ('fused_attn', 'batched_favor', 'gather_splits', 'cls_only_last_block')
ALL = 'all'
TINY = dict(img_size=64, embed_dim=64, depth=2, num_heads=2, mlp_ratio=2., num_classes=10, drop_path_rate=0.2)


class AttentionFn(nn.Module):
    "The function `attention(q, k, v, scale, fused=...)` as a module with a `fused_attn` switch, so that it fits the table."
    fast_paths = ('fused_attn',)
    def __init__(self, scale=None): super().__init__(); self.scale, self.fused_attn = scale, True
    def forward(self, q, k, v): return attention(q, k, v, scale=self.scale, fused=self.fused_attn)


def _randn(*shape, seed=0): return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _no_dropout(model):
    "Dropout probabilities 0 (the Performer's are hard-coded 0.1): the cls-only last block draws masks of other shapes."
    for m in model.modules():
        if isinstance(m, nn.Dropout): m.p = 0.
    return model


def _layer(make, train, std):
    def build():
        torch.manual_seed(0)
        return perturb_(make(), std=std).train(train)
    return build


def _model(make):
    def build():
        torch.manual_seed(0)
        return _no_dropout(make()).train()  # training mode: drop path on, the same draws on both paths (seeded)
    return build


@dataclass
class Case:
    id: str
    make: object            # () -> the module on its fast paths, in the mode to test
    inputs: object          # () -> a tuple of input tensors (each gets a gradient)
    switches: object = ALL  # switches turned off in the readable copy: ALL, or a tuple of names
    tol: float = 1e-5       # bound on max_rel_err of the output and of every gradient
    slow: bool = False      # run only with --runslow (a variant at its full depth: the 2-block row holds its every path)


CASES = [
    *[Case(f'attention-scale{s}', lambda s=s: AttentionFn(s), lambda: tuple(_randn(3, 2, 4, 33, 16).unbind(0)), ('fused_attn',))
      for s in (None, 147 ** -0.5, 1.0)],
    *[Case(f'block-{mode}', _layer(lambda: Block(48, num_heads=4, mlp_ratio=2., qkv_bias=True), mode == 'train', 0.1),
           lambda: (_randn(3, 21, 48),), ('fused_attn',)) for mode in ('eval', 'train')],
    *[Case(f'token_transformer-{mode}', _layer(lambda: TokenTransformer(576, 64), mode == 'train', 0.05),
           lambda: (_randn(2, 196, 576),), ('fused_attn',), tol=1e-4) for mode in ('eval', 'train')],
    *[Case(f'token_performer-{mode}', _layer(lambda: TokenPerformer(147, 64), mode == 'train', 0.01),
           lambda: (_randn(2, 3136, 147),), ('batched_favor',)) for mode in ('eval', 'train')],
    *[Case(f't2t_module-{tt}-{sw}', _layer(lambda tt=tt: T2TModule(64, tt, embed_dim=64), True, 0.01),
           lambda: (_randn(2, 3, 64, 64),), sw if sw == ALL else (sw,), tol=1e-4)
      for tt in ('performer', 'transformer') for sw in ('gather_splits', ALL)],
    *[Case(f'tiny_{tt}_64-{sw}', _model(lambda tt=tt: T2TViT(**TINY, tokens_type=tt)), lambda: (_randn(4, 3, 64, 64),),
           sw if sw == ALL else (sw,), tol=1e-4)
      for tt in ('performer', 'transformer') for sw in (*SWITCHES, ALL)
      if not (sw, tt) in {('batched_favor', 'transformer')}],
    *[Case(f'{name}-32px{"" if full else "-2blocks"}',
           _model(lambda name=name, full=full: create_model(name, img_size=32, num_classes=10, drop_path_rate=0.2,
                                                            **({} if full else few_blocks(name)))),
           lambda: (_randn(2, 3, 32, 32),), ALL, tol=1e-4, slow=full) for name in list_models() for full in (False, True)],
]


def _param(case): return pytest.param(case, id=case.id, marks=[pytest.mark.slow] if case.slow else [])


@pytest.mark.parametrize('case', [_param(c) for c in CASES])
def test_fast_path_equals_readable_path(case):
    "Same weights, fast paths on and off: the same output and the same gradients of inputs and every parameter."
    fast = case.make()
    readable = copy.deepcopy(fast)
    if case.switches == ALL:
        set_fast_paths(readable, False)
        assert any(getattr(m, 'fast_paths', ()) for m in readable.modules()), "nothing to switch"
    else:
        for switch in case.switches:
            found = [m for m in readable.modules() if switch in getattr(m, 'fast_paths', ())]
            assert found, f"no module of {case.id} has the switch {switch!r}"
            for m in found: setattr(m, switch, False)
    assert all(getattr(m, s) for m in fast.modules() for s in getattr(m, 'fast_paths', ())), "fast paths are the default"
    a, b = model_grads(fast, case.inputs()), model_grads(readable, case.inputs())
    names = ['output'] + [f'input {i}' for i in range(len(case.inputs()))] + [n for n, _ in fast.named_parameters()]
    assert len(a) == len(b) == len(names)
    for name, ga, gb in zip(names, a, b):
        assert (ga is None) == (gb is None), f"{name}: a gradient on one path only"
        if ga is not None: assert max_rel_err(ga, gb) < case.tol, f"{name}: max_rel_err {max_rel_err(ga, gb):.2e}"


# ------------------------------------------------------------------ the switches
def _switches(model):
    "{(module class, switch): value} of every fast-path switch in `model`."
    return {(type(m).__name__, s): getattr(m, s) for m in model.modules() for s in getattr(m, 'fast_paths', ())}


@pytest.mark.parametrize('tokens_type', ['performer', 'transformer'])
def test_each_fast_path_has_its_own_switch(tokens_type):
    "A T2T-ViT has the four switches, True by default, each declared by the class that reads it."
    model = T2TViT(**TINY, tokens_type=tokens_type)
    token_layer = ('TokenPerformer', 'batched_favor') if tokens_type == 'performer' else ('TokenAttention', 'fused_attn')
    assert _switches(model) == {('Attention', 'fused_attn'): True, token_layer: True,
                                ('T2TModule', 'gather_splits'): True, ('T2TViT', 'cls_only_last_block'): True}
    for m in model.modules():  # no switch attribute outside `fast_paths`: set_fast_paths would miss it
        assert {s for s in SWITCHES if hasattr(m, s)} == set(getattr(m, 'fast_paths', ())), type(m).__name__


@pytest.mark.parametrize('tokens_type', ['performer', 'transformer'])
def test_set_fused_attn_switches_sdpa_only(tokens_type):
    model = set_fused_attn(T2TViT(**TINY, tokens_type=tokens_type), False)
    assert all(v is (s != 'fused_attn') for (_, s), v in _switches(model).items()), _switches(model)
    set_fused_attn(model, True)
    assert all(_switches(model).values())


def test_set_fast_paths_switches_every_path():
    model = T2TViT(**TINY, tokens_type='performer')
    assert set_fast_paths(model, False) is model
    assert not any(_switches(model).values())
    assert all(_switches(set_fast_paths(model, True)).values())
    with pytest.raises(TypeError, match='enabled must be a bool'): set_fast_paths(model, 0)
    with pytest.raises(TypeError, match='model must be an nn.Module'): set_fast_paths([model], True)


def test_count_macs_counts_every_token_and_restores_the_switch():
    "count_macs runs the last block on every token (cls-only would count less) and leaves the model as it was."
    model = T2TViT(**TINY, tokens_type='transformer').train()
    macs = count_macs(model, 64)
    assert model.cls_only_last_block and model.training
    model.cls_only_last_block = False
    assert count_macs(model, 64) == macs and not model.cls_only_last_block


# ------------------------------------------------------------------ sizes that are symbols
def test_symbolic_sizes_pass_the_checks():
    "Sizes that are symbols (a SymInt, a traced 0-d tensor, an FX Proxy) pass to_2tuple and the checks unchecked."
    from t2t_course.core import to_2tuple, is_static
    assert to_2tuple(torch.tensor(5)) == (torch.tensor(5), torch.tensor(5)) and not is_static(torch.tensor(5))
    g = torch.fx.symbolic_trace(lambda x: to_2tuple((x.shape[-2], x.shape[-1]))[1] + torch.zeros(1))
    assert g(torch.zeros(1, 3, 4, 6)).item() == 6
    with pytest.raises(ValueError, match='size must be positive'): to_2tuple((0, 3))
