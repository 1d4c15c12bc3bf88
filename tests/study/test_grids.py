"""The study's grids (chapter 20a, `t2t_course.study.grids`): the claims grid's three families, whose ranges of MACs and
parameters hold the ablations' reference size, the ablations at matched parameters, and the recipes of the claims and
tune grids."""
from t2t_course.study import EPOCHS, FAMILY_LR, GRIDS, TUNE_EPOCHS, WARMUP, budget_table


def test_the_claims_grid_has_families_whose_ranges_overlap():
    rows = {r['label']: r for r in budget_table('claims')}
    models = {sm.label: sm for sm in GRIDS['claims']['models']}
    fams = {f: [l for l, sm in models.items() if sm.family == f] for f in ('T2T-ViT', 'ViT', 'ResNet')}
    assert all(len(v) >= 3 for v in fams.values()) and {'hard', 'wide', 't2t_t'} <= set(rows)
    ref = rows['t2t_64']
    for f in ('ViT', 'ResNet'):   # the reference size of the ablations lies inside both other families' ranges
        for by in ('macs', 'params'):
            xs = [rows[l][by] for l in fams[f]]
            assert min(xs) < ref[by] < max(xs), (f, by)
    for label, tol in (('wide', .1), ('hard', .15), ('t2t_t', .01)):   # the ablations at matched parameters
        assert abs(rows[label]['params'] / ref['params'] - 1) < tol
    assert abs(rows['wide']['macs'] / ref['macs'] - 1) < .1
    assert all(sm.train_args[:2] == ('--lr', f"{FAMILY_LR[sm.family or 'T2T-ViT']:g}") for sm in models.values())
    assert GRIDS['claims']['seeds'] == (0, 1, 2, 3, 4) and GRIDS['tune']['data'] == 'cluttered_digits_tune'
    # the tune grid ran once, short (5 epochs, half an epoch of warm-up); the claims grid trains until the curves flatten
    assert (GRIDS['tune']['epochs'], GRIDS['claims']['epochs']) == (TUNE_EPOCHS, EPOCHS) and TUNE_EPOCHS < EPOCHS
    assert all(sm.train_args[2:4] == WARMUP for sm in models.values())
