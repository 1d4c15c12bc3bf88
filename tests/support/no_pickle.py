"""`no_unpickling()`: a context in which `pickle.load`, `pickle.loads` and `torch.load` raise, so that whatever is read
inside it was read without unpickling anything (safetensors files, model folders)."""
import pickle
from contextlib import contextmanager
from unittest import mock

import torch


@contextmanager
def no_unpickling():
    "`pickle.load`, `pickle.loads` and `torch.load` raise inside: anything read within was read without a pickle."
    def refuse(*args, **kwargs): raise AssertionError('something was unpickled')
    with mock.patch.object(pickle, 'load', refuse), mock.patch.object(pickle, 'loads', refuse), mock.patch.object(torch, 'load', refuse):
        yield
