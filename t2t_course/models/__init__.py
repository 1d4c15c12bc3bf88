"""Part I, the model (chapters 01-10): the hard and soft splits, attention, the T2T layer, the Performer, the T2T
module, the deep-narrow backbone and its MAC counter, `T2TViT` with its registry and baselines, reading weights, and
the paper's design space.

Every public name of these modules is importable from here (`from t2t_course.models import create_model`); a module is
imported when one of its names is first asked for. Written by hand (nbdev generates the modules, not this file)."""
from ..core import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, ['hard_split', 'soft_split', 'attention', 't2t_layer', 'performer', 't2t_module',
                                               'backbone', 't2t_vit', 'weights', 'design_space'])
