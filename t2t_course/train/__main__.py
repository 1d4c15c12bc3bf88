# `python -m t2t_course.train` (and `torchrun ... -m t2t_course.train`): the `t2t_train` command (chapter 19).
# Written by hand; imports only.
import sys
from .cli import main

sys.exit(main())
