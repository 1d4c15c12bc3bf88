"""Part IV, using the models (chapters 23-24): timm's model contract on every model, export (`torch.export`, ONNX and
its check), prediction (`t2t_predict`) and conversion to model folders (`t2t_convert`). The registration in timm's registry is `t2t_course.timm` (chapter 22).

Every public name of these modules is importable from here (`from t2t_course.deploy import export_onnx, check_onnx`);
a module is imported when one of its names is first asked for. `python -m t2t_course.deploy` is `t2t_predict`.
Written by hand (nbdev generates the modules, not this file)."""
from ..core import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, ['contract', 'export', 'predict', 'convert'])
