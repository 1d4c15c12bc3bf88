"""The entry points of the course's commands (`t2t_train`, `t2t_eval`, `t2t_study`, `t2t_predict`, `t2t_prepare_val`,
`t2t_convert`), kept outside the `t2t_course` package on purpose.

Importing anything from `t2t_course` imports torch first (about two seconds, more on a cold disk), before a command's
own Ctrl-C handling exists. This module is imported without torch: it makes Ctrl-C during that start one line and
exit status 130, imports the command, gives Ctrl-C back to Python's default, and runs the command, whose own handlers
then take over (a training run saves a checkpoint, `t2t_predict` keeps what it classified). Written by hand (it is not
exported from a notebook); `python -m t2t_course.train` and the other `-m` forms do not go through it."""
import importlib, os, signal, sys

COMMANDS = {  # command: (module, function)
    't2t_train': ('t2t_course.train.cli', 'main'),
    't2t_eval': ('t2t_course.train.cli', 'eval_main'),
    't2t_study': ('t2t_course.study.cli', 'study_main'),
    't2t_predict': ('t2t_course.deploy.predict', 'predict_main'),
    't2t_prepare_val': ('t2t_course.data.imagenet_val', 'prepare_val_cli'),
    't2t_convert': ('t2t_course.deploy.convert', 'convert_main'),
}


def load(command:str):
    "The command's main function, imported with Ctrl-C as one line and exit status 130 (nothing has started yet)."
    def interrupted(signum, frame):
        os.write(2, f"{command}: interrupted (Ctrl-C) while starting; nothing was done\n".encode())
        os._exit(130)
    module, function = COMMANDS[command]
    previous = signal.signal(signal.SIGINT, interrupted)
    try: return getattr(importlib.import_module(module), function)
    finally: signal.signal(signal.SIGINT, previous)


def run(command:str):
    return load(command)()


def t2t_train(): return run('t2t_train')
def t2t_eval(): return run('t2t_eval')
def t2t_study(): return run('t2t_study')
def t2t_predict(): return run('t2t_predict')
def t2t_prepare_val(): return run('t2t_prepare_val')
def t2t_convert(): return run('t2t_convert')
