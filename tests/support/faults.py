"""Callbacks that inject faults into a training run at a given step (chapter 18d teaches the same two): a signal, as a
scheduler that preempts a job sends it, and a batch of NaNs, as a diverging run meets one."""
import os, signal

from t2t_course.train.callbacks import Callback


class SignalAfterStep(Callback):
    "Send this process (or its whole process group) `signum` after optimizer step `step`: a preemption."
    def __init__(self, step:int, signum:int=signal.SIGTERM, group:bool=False): self.step, self.signum, self.group = step, signum, group
    def after_step(self, run):
        if run.state.step != self.step: return
        if not run.stop.installed: run.stop.signum = self.signum  # not the main thread: no handler to receive it
        elif self.group: os.killpg(os.getpgrp(), self.signum)
        else: os.kill(os.getpid(), self.signum)


class NanAfterStep(Callback):
    "Feed the step after optimizer step `step` a batch of NaNs: a divergence."
    def __init__(self, step:int): self.step = step
    def before_batch(self, run):
        images, targets = run.batch
        if run.state.step == self.step and images is not None: run.batch = (images * float('nan'), targets)


class RaiseAfterStep(Callback):
    "Raise `signums` in this process, one after the other, after optimizer step `step` (SIGSTOP: a hung peer; SIGKILL: a dead one)."
    def __init__(self, step, *signums): self.step, self.signums = step, signums
    def after_step(self, run):
        if run.state.step == self.step:
            for s in self.signums: signal.raise_signal(s)
