"""Part III, evidence (chapters 20-21): the study's grids and budgets, the runner, the analysis with its
paired intervals and verdicts, the command `t2t_study`, and the pictures of what the models learned.

Every public name of these modules is importable from here (`from t2t_course.study import run_study`); a module is
imported when one of its names is first asked for. `python -m t2t_course.study` is `t2t_study`. Written by hand
(nbdev generates the modules, not this file)."""
from ..core import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, ['grids', 'runner', 'analysis', 'cli', 'visualise'])
