"""Reading a study's results (chapter 20c, `t2t_course.study.analysis`): whole seeds only, t-intervals and the verdict
rule, family curves read in log cost and never extrapolated, the claims' verdicts on made-up results; and the experiments
guide's tables and the numbers the chapters and the guides quote, against the committed claims grid (marked `docs`)."""
import json

import numpy as np
import pytest

from t2t_course.study import (EPOCHS, claim_table, complete_seeds, family_curve, family_table, grid_models, interpolate,
                              read_results, report, seeds_to_settle, summarize, t_interval, verdict)

from tests.support.commands import REPO


def test_complete_seeds_keeps_whole_seeds_only():
    rows = [dict(model=m, seed=s) for s in (0, 1) for m in 'ab'] + [dict(model='a', seed=2)]
    assert {r['seed'] for r in complete_seeds(rows)} == {0, 1}
    assert complete_seeds(rows, ['a']) == rows and complete_seeds(rows, ['a', 'c']) == []


def _rows(label, accs, family='', macs=1, params=1):
    return [dict(model=label, family=family, seed=s, val_acc1=a, ema_val_acc1=a, params=params, macs=macs, train_s=10.)
            for s, a in enumerate(accs)]


def test_t_interval_and_the_one_rule():
    mean, lo, hi = t_interval([1., 2., 3., 4., 5.])
    assert mean == 3 and hi - mean == pytest.approx(2.776445 * np.std([1, 2, 3, 4, 5], ddof=1) / 5 ** .5, rel=1e-5)
    assert (verdict(0.5, 2.), verdict(-2., -0.5), verdict(-1., 1.)) == ('holds', 'reversed', 'not settled at this scale')
    assert verdict(-0.8, 0.5, margin=-1.) == 'holds'                        # a non-inferiority claim: above -1 point
    assert seeds_to_settle([1., -1., 2., 0., 1.]) > 5 and seeds_to_settle([0., 0.1, -0.1, 0., 0.]) is None


def test_family_curves_interpolate_in_log_cost_and_never_extrapolate():
    r = _rows('s', [10, 20], 'F', macs=1e6) + _rows('l', [30, 40], 'F', macs=1e8)
    c = family_curve(r, 'F')
    assert interpolate(c, 1e7, 0) == pytest.approx(20) and interpolate(c, 1e7, 1) == pytest.approx(30)   # halfway in log
    assert interpolate(c, 1e9, 0) is None and interpolate(c, 1e5, 0) is None


def test_claim_verdicts_on_made_up_results():
    r = (_rows('t2t_64', [80, 81, 82, 80, 81], 'T2T-ViT', 6e6, 2e5) + _rows('t2t_48', [75, 76, 77, 75, 76], 'T2T-ViT', 5e6, 1e5)
         + _rows('t2t_96', [85, 86, 85, 86, 85], 'T2T-ViT', 1e7, 5e5)
         + _rows('hard', [70, 71, 72, 70, 71]) + _rows('wide', [90, 91, 92, 90, 91]) + _rows('t2t_t', [80, 80, 81, 80, 80])
         + _rows('vit_48', [60, 61, 62, 60, 61], 'ViT', 2e6, 1e5) + _rows('vit_96', [70, 71, 72, 70, 71], 'ViT', 9e6, 5e5))
    v = {(c['claim'], c['comparison']): c for c in claim_table(r)}
    assert v['a', 'same seed']['verdict'] == 'holds' and v['c', 'same seed']['verdict'] == 'reversed'
    assert v['d', 'same seed']['verdict'] == 'holds' and v['d', 'same seed']['diff'] == pytest.approx(0.6)
    assert v['b', 'matched MACs']['at'] == 't2t_64' and v['b', 'matched MACs']['verdict'] == 'holds'
    assert v['b', 'matched params']['verdict'] == 'holds'
    assert not any(k[0] in 'ef' for k in v)          # no ResNet in these results: those claims are left out
    at = {row['at'] for row in family_table(r) if row['comparison'] == 'matched MACs'}
    assert at == {'t2t_48', 't2t_64'}                # t2t_96 (10M MACs) lies outside ViT's range (2M-9M): not extrapolated
    s = {x['model']: x for x in summarize(r)}
    assert s['t2t_64']['acc_mean'] == 80.8 and s['t2t_64']['family'] == 'T2T-ViT'


# ------------------------------------------------------------------ the prose against the committed grid
@pytest.mark.docs
def test_experiments_guide_reports_the_committed_claims_grid():
    "The experiments guide's tables are the committed claims grid's report on its whole seeds, as chapter 20c prints it, digit for digit."
    kept = read_results(REPO / 'nbs' / 'study' / 'claims' / 'results.csv')
    rows = complete_seeds(kept, grid_models('claims'))
    assert rows and {r['epochs'] for r in rows} == {EPOCHS}
    guide = (REPO / 'nbs' / 'guides' / 'experiments.md').read_text()
    for table in report(rows, markdown=True).split('\n\n'):
        assert table in guide, f"nbs/guides/experiments.md is not the committed rows' report; it should hold:\n{table}"


def _committed_grid_numbers():
    """Every number a text may quote from a committed run of the claims grid (today's and the earlier ones kept beside it):
    each claim's interval (difference, low, high) at every size `family_table` reads, and per model its seed mean and
    every single run's top-1."""
    intervals, accs = set(), {}
    for f in [REPO / 'nbs' / 'study' / 'claims' / 'results.csv', *sorted((REPO / 'nbs' / 'study').glob('claims_*.csv'))]:
        rows = complete_seeds(read_results(f), grid_models('claims'))
        intervals |= {(c['diff'], c['lo'], c['hi']) for c in claim_table(rows) + family_table(rows) if c['n']}
        for r in rows: accs.setdefault(r['model'], set()).add(r['val_acc1'])
        for s in summarize(rows): accs[s['model']].add(s['acc_mean'])
    return intervals, accs


def _quotes(text:str, pattern):
    "The matches of `pattern` in `text`, with any run of white space (a line break of the prose) read as one space."
    return pattern.findall(' '.join(text.split()))


@pytest.mark.docs
def test_the_texts_quote_the_committed_grid():
    """The prose of chapters 20 and 21, of the Part I chapters that end with chapter 20's verdict on their claim (02, 05, 06,
    07, 09b, 10), and of the guides and the README quotes the grid's numbers by hand: every interval written as
    `+8.0 [+3.3, +12.7]` (or `+8.0 points [...]`) is one the committed rows give, to the digits written, and so is every
    top-1 written after a model's label (`t2t_64 89.1%`: a seed mean or one run). A grid re-run without the prose
    rewritten fails here."""
    import re
    intervals, accs = _committed_grid_numbers()
    num = r'([+-]\d+\.\d+)'
    interval = re.compile(num + r'(?: points)? \[' + num + ', ' + num + r'\]')
    top1 = re.compile(r'`?\b(' + '|'.join(accs) + r')\b`?:? (?:reaches |at )?(\d+\.\d+)%')
    texts = {p.name: p.read_text() for p in [REPO / 'README.md', *sorted((REPO / 'nbs' / 'guides').glob('*.md'))]}
    for nb in ('02_soft_split', '05_performer', '06_t2t_module', '07_backbone', '09b_train', '10_design_space',
               '20a_grids', '20b_runner', '20c_analysis', '20d_cli', '21_visualise'):
        cells = json.loads((REPO / 'nbs' / f'{nb}.ipynb').read_text())['cells']
        texts[nb] = '\n\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'markdown')
    same = lambda quoted, x: round(x, len(quoted.split('.')[1])) == float(quoted)
    checked, wrong = 0, []
    for name, text in texts.items():
        for q in _quotes(text, interval):
            checked += 1
            if not any(all(same(a, b) for a, b in zip(q, iv)) for iv in intervals): wrong.append(f"{name}: {q[0]} [{q[1]}, {q[2]}]")
        for label, acc in _quotes(text, top1):
            checked += 1
            if not any(same(acc, x) for x in accs[label]): wrong.append(f"{name}: {label} {acc}%")
    assert not wrong, "quoted, but no committed run of the claims grid gives it (to the digits written):\n" + '\n'.join(wrong)
    assert checked >= 20   # the verdicts of chapter 20 and the experiments guide are quoted, not only tabulated
