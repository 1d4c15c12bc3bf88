"""Keep a long study's finished runs in the repository, to continue it on another day or machine.

A study folder (`t2t_study --output DIR`) holds every run's checkpoints; only its `results.csv` is needed to continue
(`--resume` skips the runs it lists); chapter 20 reads it. Chapter 21 also needs, from the family runs, their channel rows (computed from
each run's `last.pth`) and the seed-0 weights of the three models it draws. `save` keeps exactly that:

    python tools/study_progress.py save /path/to/study nbs/study/claims
        results.csv    the finished rows (as the study wrote them)
        channels.csv   chapter 21's channel rows of every finished family run (added run by run, never recomputed)
        checkpoints/   <label>_seed0.pth, the state_dict of resnet_16, vit_64 and t2t_64's seed-0 runs

    python tools/study_progress.py restore nbs/study/claims /path/to/new/study
        writes the kept results.csv into a new study folder: `t2t_study --output /path/to/new/study --resume` continues
"""
import argparse, csv, shutil, sys
from pathlib import Path

DRAWN = ('resnet_16', 'vit_64', 't2t_64')   # chapter 21's three models, seed 0


def save(study:Path, dest:Path) -> None:
    import torch
    from t2t_course.data.datasets import data_root, get_dataset, is_builtin
    from t2t_course.study import read_results, write_results
    from t2t_course.data.transforms import create_datasets
    from t2t_course.study.visualise import CHANNEL_COLUMNS, channel_table, probe_batch, run_model
    rows = read_results(study / 'results.csv')
    if not rows: sys.exit(f"study_progress: no finished runs in {study / 'results.csv'}")
    (dest / 'checkpoints').mkdir(parents=True, exist_ok=True)
    write_results(rows, dest / 'results.csv')
    ch_path = dest / 'channels.csv'
    kept = list(csv.DictReader(open(ch_path))) if ch_path.exists() else []
    done = {(r['model'], int(r['seed'])) for r in kept}
    new = [r for r in rows if r['family'] and (r['model'], r['seed']) not in done]
    if new:   # on chapter 21's batch of the study's validation images (a built-in dataset: the row names it, not its path)
        if not is_builtin(rows[0]['data']): sys.exit(f"study_progress: {rows[0]['data']!r} is not a built-in dataset")
        preset = get_dataset(rows[0]['data']).recipe['data_preset']
        _, val = create_datasets(data_root(rows[0]['data']), rows[0]['img_size'], preset)
        xb, _ = probe_batch(val, 26)
        kept += channel_table(study, new, xb)
        with open(ch_path, 'w', newline='') as f:
            w = csv.DictWriter(f, fieldnames=CHANNEL_COLUMNS, lineterminator='\n'); w.writeheader(); w.writerows(kept)
    for r in rows:
        out = dest / 'checkpoints' / f"{r['model']}_seed0.pth"
        if r['model'] in DRAWN and r['seed'] == 0 and not out.exists():
            torch.save(run_model(study, r).state_dict(), out)
    print(f"study_progress: {len(rows)} runs kept in {dest} ({len(new)} new family runs measured for chapter 21)")


def restore(dest:Path, study:Path) -> None:
    if (study / 'results.csv').exists(): sys.exit(f"study_progress: {study} already holds a results.csv; choose a new folder")
    study.mkdir(parents=True, exist_ok=True)
    shutil.copy(dest / 'results.csv', study / 'results.csv')
    print(f"study_progress: continue with t2t_study --output {study} --resume (and the grid's other flags)")


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = p.add_subparsers(dest='cmd', required=True)
    s = sub.add_parser('save', help='keep a study folder\'s finished runs in DEST'); s.add_argument('study', type=Path); s.add_argument('dest', type=Path)
    r = sub.add_parser('restore', help='start a study folder from a kept results.csv'); r.add_argument('dest', type=Path); r.add_argument('study', type=Path)
    a = p.parse_args()
    save(a.study, a.dest) if a.cmd == 'save' else restore(a.dest, a.study)
