"""`t2t_train` with a fault injected through a callback, for tests that need a real process (signals, process groups,
hung peers). Usage, from the repository: python -m tests.support.fault_run FAULT -- T2T_TRAIN_ARGS...

FAULT is `none` or KIND[@RANK]:K, the fault after optimizer step K (on process RANK only, if given):
  signal        SIGTERM to this process          signal-group  SIGTERM to its whole process group
  sigint        SIGINT (Ctrl-C)                   sigint2       SIGINT twice in a row (Ctrl-C, then Ctrl-C again)
  nan           NaN images in the next step       stop          SIGSTOP to this process (a hung peer)
  kill          SIGKILL to this process (a dead peer)"""
import os, signal, sys

from t2t_course.train.cli import main
from tests.support.faults import NanAfterStep, RaiseAfterStep, SignalAfterStep


def fault(spec:str) -> list:
    if spec == 'none': return []
    kind, k = spec.split(':'); k = int(k)
    if '@' in kind:
        kind, rank = kind.split('@')
        if int(os.environ.get('RANK', 0)) != int(rank): return []
    return {'signal': [SignalAfterStep(k)], 'signal-group': [SignalAfterStep(k, group=True)],
            'sigint': [SignalAfterStep(k, signal.SIGINT)], 'sigint2': [RaiseAfterStep(k, signal.SIGINT, signal.SIGINT)],
            'nan': [NanAfterStep(k)], 'stop': [RaiseAfterStep(k, signal.SIGSTOP)], 'kill': [RaiseAfterStep(k, signal.SIGKILL)]}[kind]


if __name__ == '__main__':
    spec, sep, *args = sys.argv[1:]
    assert sep == '--', __doc__
    sys.exit(main(args, callbacks=fault(spec)))
