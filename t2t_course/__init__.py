__version__ = "0.0.1"

# The practitioner's entry points (t2t_course/*.py is generated from nbs/ by nbdev_export; this file is not).
from .models import create_model, list_models, T2TViT
from . import design_space  # registers the paper's CNN-inspired designs (chapter 10) with create_model
from . import contract      # timm's model contract on every model (chapter 22): forward_intermediates, feature_info, ...; needs no timm
