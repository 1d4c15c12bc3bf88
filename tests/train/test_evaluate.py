"""Evaluation (chapter 16, `t2t_course.train.evaluate`): `evaluate` sums the loss, the hits and the image count on the
device and reads them back once. The t2t_eval command: test_cli.py."""
import torch

from tests.support.host_reads import count_reads


def test_evaluate_reads_the_counts_once(monkeypatch):
    "evaluate sums loss, hits and the image count on the device and brings them to the host once, at the end."
    from t2t_course.data import Batch
    from t2t_course.train.evaluate import evaluate
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 7))
    loader = [Batch(torch.randn(5, 3, 2, 2), torch.randint(0, 7, (5,)), []) for _ in range(4)]
    reads = count_reads(monkeypatch)
    m = evaluate(net, loader, torch.device('cpu'))
    monkeypatch.undo()
    assert reads == ['tolist'] and m['n'] == 20, reads
