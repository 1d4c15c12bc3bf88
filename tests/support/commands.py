"""What the tests of the commands share: the repository and this Python, a tiny model's settings and `t2t_train`'s
arguments for it, the fault-injecting `t2t_train` (tests/support/fault_run.py, run as a module of the repository), and
ways to run a command: a process of this Python forked warm (`run`), or its entry point in this process (`call`,
`warm_study`)."""
import io, os, sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from tests.support.warm import WarmPopen, warm_run
from t2t_course.study import study_main

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
TINY = dict(embed_dim=32, depth=1, num_heads=2, mlp_ratio=2., token_dim=16)
TINY_ARGS = ['--model', 't2t_vit_7', '--model-kwargs', 'embed_dim=32', 'depth=1', 'num_heads=2', 'mlp_ratio=2.0',
             'token_dim=16', '--img-size', '16', '--threads', '1', '--no-progress']
RESUME_ARGS = [*TINY_ARGS, '--batch-size', '8', '--epochs', '3', '--lr', '0.2', '--workers', '1', '--deterministic',
               '--ema-decay', '0.9', '--mix-prob', '0.5']  # mixing on: its random draws must resume exactly too
FAULT = ['-m', 'tests.support.fault_run']  # t2t_train with a fault injected (tests/support/fault_run.py), from the repository


def run(args, env=None, timeout=300):
    "Run a command line of this Python in the repository; the CompletedProcess."
    e = dict(os.environ, PYTHONWARNINGS='ignore', **(env or {}))
    return warm_run([PY, *args], cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout)


def call(fn, argv):
    "Call a command's entry point in-process; (exit status, stdout, stderr) (argparse errors exit with 2)."
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try: code = fn(argv)
        except SystemExit as e: code = e.code
    return code, out.getvalue(), err.getvalue()


def max_diff(a:dict, b:dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def train_args(folder, out, *more):
    return ['--data', str(folder), *TINY_ARGS, '-b', '8', '--workers', '0', '--output', str(out), *more]


def no_traceback(text):
    assert 'Traceback' not in text, text[-3000:]


def warm_study(argv):
    "`t2t_study`'s entry point in this process, its runs forked warm (tests/support/warm.py) instead of started fresh."
    return study_main(argv, popen=WarmPopen)
