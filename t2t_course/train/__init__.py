"""Part II, training (chapters 13-19): the optimizer and schedule, distributed processes, checkpoints, evaluation, the
config, the step, callbacks, the run and its exact resume, the loop and `train(config)`, and the command lines.

Every public name of these modules is importable from here (`from t2t_course.train import TrainConfig, train`); a
module is imported when one of its names is first asked for. `python -m t2t_course.train` is `t2t_train`. Written by
hand (nbdev generates the modules, not this file)."""
from ..core import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, ['optim', 'distributed', 'checkpoint', 'evaluate', 'config', 'step',
                                               'callbacks', 'run', 'loop', 'cli'])
