"""Run by tests/train/test_distributed.py under torchrun with one process per visible GPU (NCCL): a collective on every
GPU, one DDP step against the same step on the combined batch, and (with two GPUs or more) a short `train()` run.
Usage, from the repository: torchrun --nproc_per_node N -m tests.support.nccl_worker FOLDER OUT"""
import os, sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from t2t_course.models.t2t_vit import create_model
from t2t_course.data import create_loss
from t2t_course.train.config import TrainConfig
from t2t_course.train import forward_backward, train

TINY = dict(tokens_type='transformer', embed_dim=32, depth=1, num_heads=2, mlp_ratio=2., token_dim=16)


def main(folder, out):
    local, world = int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE'])
    dev = torch.device('cuda', local)
    torch.cuda.set_device(dev)
    dist.init_process_group('nccl', device_id=dev)  # even for one process: NCCL itself is what is checked
    rank = dist.get_rank()
    t = torch.full((4,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    assert t.tolist() == [world * (world + 1) / 2] * 4, t  # the sum over ranks of rank + 1
    torch.manual_seed(0)
    model = create_model('t2t_vit_7', num_classes=4, img_size=16, **TINY).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2 * world, 3, 16, 16, generator=g), torch.randint(0, 4, (2 * world,), generator=g)
    loss = forward_backward(ddp, x[2 * rank:2 * rank + 2].to(dev), F.one_hot(y[2 * rank:2 * rank + 2], 4).float().to(dev),
                            create_loss(True, 0.1))
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters()}
    dist.destroy_process_group()
    if world > 1:  # the training loop's own process group, on NCCL
        r = train(TrainConfig(data=str(folder), model='t2t_vit_7', model_kwargs=TINY, img_size=16, batch_size=4, epochs=1,
                              workers=0, device='cuda', output=str(Path(out) / 'run'), progress=False))
        assert r.exit_code == 0
    if rank == 0: torch.save(dict(world=world, grads=grads, loss=loss.item()), Path(out) / 'nccl.pt')


if __name__ == '__main__':
    main(*sys.argv[1:3])
