"""Part II, data (chapter 11): decoding images, image folders and their loader, the recipe's transforms, MixUp/CutMix
and label smoothing, the built-in datasets and the ILSVRC2012 validation sorter; the synthetic test photos of chapter
12. The four input pipelines are the subpackage `t2t_course.data.pipelines` (chapter 12).

Every public name of these modules is importable from here (`from t2t_course.data import create_datasets`); a module
is imported when one of its names is first asked for. Written by hand (nbdev generates the modules, not this file)."""
from ..core import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, ['images', 'loader', 'transforms', 'mixing', 'datasets', 'imagenet_val',
                                               'synthetic', 'pipelines'])
