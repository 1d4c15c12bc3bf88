"""tools/slurm/train.sbatch, run with stand-ins for SLURM's `scontrol` and `srun` (which record their arguments): one
torchrun per node, the c10d rendezvous on the job's first host at the job's port, t2t_train's arguments passed on, and
`--resume auto`, so a requeued job continues."""
import os, subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_sbatch_script_starts_torchrun_per_node_with_c10d(tmp_path):
    bin_ = tmp_path / 'bin'; bin_.mkdir()
    (bin_ / 'scontrol').write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "gpu07\\ngpu08\\n"\n')
    (bin_ / 'srun').write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/srun.args\n')
    for f in bin_.iterdir(): f.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", SLURM_JOB_NODELIST='gpu[07-08]', SLURM_JOB_ID='123456',
               SLURM_JOB_NUM_NODES='2', T2T_VENV=str(tmp_path / 'none'))
    p = subprocess.run(['bash', 'tools/slurm/train.sbatch', '--data', '/data/imagenet', '--model', 't2t_vit_14', '-b', '64'],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    args = (tmp_path / 'srun.args').read_text().split('\n')[:-1]
    assert args[:2] == ['--kill-on-bad-exit=1', '--ntasks-per-node=1'] and 'torch.distributed.run' in args
    port = 15000 + 123456 % 17000
    opts = dict(zip(args, args[1:]))
    assert (opts['--nnodes'], opts['--nproc-per-node'], opts['--rdzv-backend'], opts['--rdzv-endpoint']) == \
        ('2', '8', 'c10d', f'gpu07:{port}')
    assert args[args.index('-m', args.index('torch.distributed.run')):] == \
        ['-m', 't2t_course.train', '--resume', 'auto', '--data', '/data/imagenet', '--model', 't2t_vit_14', '-b', '64']
    assert f'rendezvous at gpu07:{port}' in p.stdout
