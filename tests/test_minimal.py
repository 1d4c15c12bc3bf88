"""The whole T2T-ViT on one page (t2t_course/minimal.py, chapter 09) against the library and the official code:
the nine presets' state_dict layouts, strict loads and equal float32 logits on random weights, the golden official
T2T-ViT-7, and the page itself (its length and its imports).
"""
import ast, json
from pathlib import Path

import pytest
import torch

import t2t_course
from t2t_course import minimal

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / 'reference'
PAGE = ROOT / 't2t_course' / 'minimal.py'
OFFICIAL = json.loads((REF / 'official_state_dicts.json').read_text())


@pytest.mark.parametrize('name', list(minimal.PRESETS))
def test_layout_is_official(name):
    "Keys, shapes and their order, the element counts and the trained count equal the official code's."
    with torch.device('meta'): m = minimal.create(name)
    sd = m.state_dict()
    assert [[k, list(v.shape)] for k, v in sd.items()] == [[k, v] for k, v in OFFICIAL[name]['keys'].items()]
    assert sum(v.numel() for v in sd.values()) == OFFICIAL[name]['state_dict_numel']
    assert sum(p.numel() for p in m.parameters()) == OFFICIAL[name]['trainable_numel']


@pytest.mark.parametrize('name', ['t2t_vit_7', 't2t_vit_14', 't2t_vit_t_14'])
def test_logits_equal_the_library(name):
    "The library's random weights load with strict=True and give the same fp32 eval logits (224 px, batch 2)."
    torch.manual_seed(0)
    lib = t2t_course.create_model(name).eval()
    with torch.device('meta'): m = minimal.create(name).eval()  # no init to pay for: every number comes from `lib`
    m.load_state_dict(lib.state_dict(), strict=True, assign=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad(): torch.testing.assert_close(m(x), lib(x), rtol=1e-5, atol=1e-5)


def test_golden_t2t_vit_7():
    "Built on the CPU, the official T2T-ViT-7 (golden file) loads strictly: the official tokens and logits, the library's logits."
    g = torch.load(REF / 'golden' / 't2t_vit_7_224.pt', weights_only=False)
    m, lib = minimal.create('t2t_vit_7').eval(), t2t_course.create_model('t2t_vit_7').eval()
    torch.testing.assert_close(m.pos_embed, lib.pos_embed, rtol=0, atol=0)  # built, not loaded: the same table
    w = m.tokens_to_token.attention1.w                                       # (32, 64): orthogonal rows of norm sqrt(32)
    torch.testing.assert_close(w @ w.T, 32 * torch.eye(32), rtol=0, atol=1e-4)
    m.load_state_dict(g['state_dict'], strict=True)
    lib.load_state_dict(g['state_dict'], strict=True)
    with torch.no_grad():
        torch.testing.assert_close(m.tokens_to_token(g['input']), g['t2t_tokens'], rtol=1e-5, atol=1e-5)
        logits = m(g['input'])
        torch.testing.assert_close(logits, g['logits'], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits, lib(g['input']), rtol=1e-5, atol=1e-5)


def test_unknown_name():
    with pytest.raises(ValueError, match="unknown model 't2t_vit_8': one of t2t_vit_7, "): minimal.create('t2t_vit_8')


def test_other_class_count_and_training_mode():
    "num_classes, drop_path_rate and the training-mode dropouts work (a small image keeps it fast)."
    m = minimal.create('t2t_vit_7', num_classes=10, img_size=64, drop_path_rate=0.1).train()
    assert m.blocks[0].drop_path == 0. and m.blocks[-1].drop_path == pytest.approx(0.1)
    out = m(torch.randn(4, 3, 64, 64))
    assert out.shape == (4, 10)
    out.sum().backward()
    assert m.tokens_to_token.attention1.w.grad is None and m.cls_token.grad is not None  # w is fixed, cls is trained


def test_page_has_at_most_250_code_lines():
    lines = [l for l in PAGE.read_text().splitlines() if l.strip() and not l.strip().startswith('#')]
    assert len(lines) <= 250, f"{len(lines)} code lines (not blank, not a comment)"


def test_page_imports_only_torch_einops_and_the_standard_library():
    tree = ast.parse(PAGE.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {'.' * n.level + (n.module or '') for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(name.startswith('.') for name in imported), f"relative imports: {imported}"
    roots = {name.split('.')[0] for name in imported}
    allowed = {'torch', 'einops'} | set(__import__('sys').stdlib_module_names)
    assert roots <= allowed and 't2t_course' not in roots, f"imports outside torch, einops and the stdlib: {roots - allowed}"


def test_page_starts_with_its_licence():
    head = PAGE.read_text().splitlines()[:12]
    assert 'Apache-2.0' in head[0] and '# SPDX-License-Identifier: Apache-2.0' in head


@pytest.mark.parametrize('shape', [(1, 3, 200, 200), (1, 3, 256, 256), (1, 3, 224, 320), (1, 1, 224, 224)])
def test_an_input_it_cannot_take_is_one_line(shape):
    "The position table is made for one size: another size or channel count is named with what the model expects."
    with torch.device('meta'): m = minimal.create('t2t_vit_7')
    with pytest.raises(ValueError) as e: m(torch.empty(shape, device='meta'))
    assert str(e.value).startswith(f"expected images (B, 3, 224, 224), got {shape}") and '\n' not in str(e.value)
