__version__ = "0.0.1"

# The practitioner's entry points. The modules are generated from nbs/ by nbdev_export; the packages' __init__.py and
# __main__.py files are not: they are written by hand, and hold only imports.
from .models.t2t_vit import create_model, list_models, T2TViT
from .models import design_space  # registers the paper's CNN-inspired designs (chapter 10) with create_model
from .deploy import contract      # timm's model contract on every model (chapter 23): forward_intermediates, feature_info, ...; needs no timm
