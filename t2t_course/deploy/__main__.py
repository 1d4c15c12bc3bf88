# `python -m t2t_course.deploy`: the `t2t_predict` command (chapter 24b). Written by hand; imports only.
import sys
from .predict import predict_main

sys.exit(predict_main())
