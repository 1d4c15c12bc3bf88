"""Part II, input pipelines (chapter 12): `draft` (crop first, decode at the coarsest DCT scale), `gpu` (nvJPEG and
batched augmentation on the device), `fast` (uint8 workers, exact kernels), and the registry that builds any of them
and `pil` (`create_pipeline`).

Every public name of these modules is importable from here; a module is imported when one of its names is first asked
for. Written by hand (nbdev generates the modules, not this file)."""
from ...core import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, ['registry', 'draft', 'gpu', 'fast'])
