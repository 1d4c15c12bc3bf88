"""Counting the reads of a tensor's value on the host (for the tests that check an EMA update or an evaluation never
waits for the device)."""
import torch


def count_reads(monkeypatch):
    "Count the calls that copy a tensor's value to the host (each one a wait for the GPU there)."
    reads = []
    for name in ('item', 'tolist', '__bool__', '__float__', '__int__'):
        orig = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=orig, _n=name, **k: (reads.append(_n), _o(self, *a, **k))[1])
    return reads
