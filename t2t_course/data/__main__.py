# `python -m t2t_course.data`: the `t2t_prepare_val` command (chapter 11f). Written by hand; imports only.
import sys
from .imagenet_val import prepare_val_cli

sys.exit(prepare_val_cli())
