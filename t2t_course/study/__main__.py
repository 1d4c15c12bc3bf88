# `python -m t2t_course.study`: the `t2t_study` command (chapter 20d). Written by hand; imports only.
import sys
from .cli import study_main

sys.exit(study_main())
