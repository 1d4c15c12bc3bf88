"""The backbone (chapter 07, `t2t_course.models.backbone`) in the registered models: the position table (the sinusoid
in torch ops equals numpy's; whether the table is the fixed sinusoid is decided when it is loaded, tables of other
lengths are cached outside the state_dict, a learned table follows the grid), the head's class count, and `count_macs`
on fake tensors against real ones."""
import pytest
import torch
import torch.nn as nn

import t2t_course
from t2t_course import create_model
from t2t_course.models.backbone import count_macs, get_sinusoid_encoding, resize_pos_embed


# ------------------------------------------------------------------ the position table: decided at build and load, cached
def test_a_loaded_non_sinusoid_table_is_not_silently_replaced():
    "After loading a fine-tuned (non-sinusoid) table, another input size is refused instead of swapping the table."
    model = create_model('t2t_vit_7', img_size=64).eval()
    sd = model.state_dict()
    sd['pos_embed'] = sd['pos_embed'] + 0.05 * torch.randn_like(sd['pos_embed'])
    model.load_state_dict(sd)
    with torch.no_grad(): model(torch.randn(1, 3, 64, 64))  # its own size works
    with pytest.raises(ValueError, match=r'loaded \(not the fixed sinusoid\) position table for 16 tokens and got 36'):
        model(torch.randn(1, 3, 96, 96))


def test_fixed_table_is_decided_at_load_not_in_forward():
    "`fixed_pos_embed` follows what load_state_dict loads; forward never checks the table's values."
    model = create_model('t2t_vit_7', img_size=64, embed_dim=64, depth=1, num_heads=2).eval()
    assert model.fixed_pos_embed
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    tuned = dict(sd, pos_embed=sd['pos_embed'] + 0.05)
    model.load_state_dict(tuned)
    assert not model.fixed_pos_embed
    with pytest.raises(ValueError, match='loaded \\(not the fixed sinusoid\\) position table'): model(torch.randn(1, 3, 96, 96))
    model.load_state_dict(sd)
    assert model.fixed_pos_embed
    with torch.no_grad(): model(torch.randn(1, 3, 96, 96))
    wrapped = nn.Sequential(create_model('t2t_vit_7', img_size=64, embed_dim=64, depth=1, num_heads=2))
    wrapped.load_state_dict({'0.' + k: v for k, v in tuned.items()})       # the hook fires through a parent too
    assert not wrapped[0].fixed_pos_embed


def test_tables_of_other_lengths_are_cached_outside_the_state_dict():
    model = create_model('t2t_vit_7', img_size=64, embed_dim=64, depth=1, num_heads=2).eval()
    keys = set(model.state_dict())
    with torch.no_grad():
        model(torch.randn(1, 3, 96, 96)); model(torch.randn(1, 3, 96, 96))
        model(torch.randn(1, 3, 32, 32))                                       # shorter: the beginning of pos_embed, no entry
    assert list(model._pos_cache) == [(37, torch.device('cpu'), torch.float32)]
    assert set(model.state_dict()) == keys                                     # the official layout is unchanged
    torch.testing.assert_close(model._pos_cache[(37, torch.device('cpu'), torch.float32)], get_sinusoid_encoding(37, 64))
    assert model.position_table(37) is model.position_table(37)                # computed once
    model.load_state_dict(model.state_dict())
    assert model._pos_cache == {}                                              # loading empties it
    for n in range(40, 60): model.position_table(n)
    assert len(model._pos_cache) == 8                                          # a few lengths, not all of them
    with torch.inference_mode(): table = model.position_table(99)
    assert not table.is_inference()                                            # usable outside inference mode afterwards


def test_sinusoid_table_in_torch_ops_equals_numpys():
    from t2t_course.models.backbone import sinusoid_table
    for n, d in [(197, 384), (577, 256), (10, 7)]:
        assert (sinusoid_table(n, d) - get_sinusoid_encoding(n, d)).abs().max() <= 6e-8


def test_a_compiled_graph_reads_the_table_it_has_and_computes_only_longer_ones():
    """Under torch.compile a length known while compiling, up to the table's, is a slice of pos_embed (no sines in the
    graph); a longer one is computed in the graph. The same logits either way."""
    model = create_model('t2t_vit_7', img_size=64, embed_dim=64, depth=1, num_heads=2).eval()
    graphs = []
    def backend(gm, example_inputs):  # record dynamo's graph and run it as it is: no inductor
        graphs.append(gm.code); return gm.forward
    for size in (64, 32, 96):  # 16 and 4 tokens (the table's beginning), 36 (longer than the table)
        torch._dynamo.reset(); graphs.clear()
        x = torch.randn(1, 3, size, size)
        with torch.no_grad(): torch.testing.assert_close(torch.compile(model, backend=backend, dynamic=False)(x), model(x))
        code = '\n'.join(graphs)
        assert ('sin' in code) == (size == 96), (size, code[:2000])


def test_learned_table_follows_the_grid_not_just_the_length():
    "A ViT built at 64 px (4 x 4) run at 128 x 32 (8 x 2, also 16 tokens) resizes its table to the new grid."
    vit = create_model('vit_baseline', img_size=64, embed_dim=32, depth=1, num_heads=2).eval()
    table = vit.position_table(17, (8, 2))
    torch.testing.assert_close(table, resize_pos_embed(vit.pos_embed, (8, 2), (4, 4)))
    assert vit.position_table(17, (4, 4)) is vit.pos_embed


# ------------------------------------------------------------------ the head
def test_num_classes_must_be_non_negative():
    with pytest.raises(ValueError, match=r'num_classes must be an int >= 0 .* got -1'):
        t2t_course.create_model('t2t_vit_7', num_classes=-1)
    model = t2t_course.create_model('t2t_vit_7', img_size=32)
    with pytest.raises(ValueError, match='num_classes must be an int >= 0'): model.reset_classifier(-3)


# ------------------------------------------------------------------ MACs
def test_count_macs_fake_equals_real():
    model = create_model('t2t_vit_7', img_size=64)
    assert count_macs(model, 64) == count_macs(model, 64, fake=False)


def test_count_macs_of_a_token_layer_as_the_root():
    "A TokenPerformer counted on its own gives what it gives inside a container: its Linears are not Performer MACs."
    import torch.nn as nn
    from t2t_course.models.performer import TokenPerformer
    from t2t_course.models.backbone import count_macs
    x = torch.zeros(1, 3136, 147)
    alone, inside = count_macs(TokenPerformer(147, 64), inputs=x), count_macs(nn.Sequential(TokenPerformer(147, 64)), inputs=x)
    assert alone == inside and alone['attention'] == 0 and alone['performer'] > 0
