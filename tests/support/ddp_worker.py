"""Run by tests/train/test_distributed.py under torchrun with 2 CPU processes (gloo): what DDP computes, for the test
to compare with a single process on the combined batch. Usage, from the repository:
torchrun --nproc_per_node 2 -m tests.support.ddp_worker FOLDER OUT"""
import dataclasses, sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from t2t_course.models.t2t_vit import create_model
from t2t_course.data import create_datasets, create_loader, create_loss
from t2t_course.train.config import TrainConfig
from t2t_course.train.distributed import ShardSampler, StopVote, all_gather_objects, all_reduce_sum, setup_distributed
from t2t_course.train.evaluate import evaluate
from t2t_course.train import build_run, forward_backward, train, train_step
from t2t_course.train.loop import train_one_epoch

# A deterministic tiny model: transformer token layers (no dropout), no drop path.
TINY = dict(tokens_type='transformer', embed_dim=32, depth=1, num_heads=2, mlp_ratio=2., token_dim=16)


def fixed_batch(n=8, num_classes=4, size=16):
    "The batch both sides split: images (n, 3, size, size) and targets (n,), from a fixed generator."
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, size, size, generator=g), torch.randint(0, num_classes, (n,), generator=g)


def config(folder, output, batch_size):
    "The run both sides make: no mixing (the processes' random streams differ), deterministic, quiet."
    return TrainConfig(data=str(folder), model='t2t_vit_7', model_kwargs=TINY, img_size=16, batch_size=batch_size, epochs=2,
                       lr=0.05, drop_path=0., ema_decay=0.9, workers=0, deterministic=True, output=str(output),
                       data_preset='digits', progress=False, threads=1, device='cpu').resolve()  # equivalence is a CPU property


def accumulation_run(folder, output, batch_size, accum, env=None) -> dict:
    "One epoch of the loop in float64 (no dropout, drop path or mixing) at `batch_size` x `accum`: step count and weights."
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the model, its tables and its optimizer state in float64; the loop casts the images
    try:
        cfg = dataclasses.replace(config(folder, output, batch_size), grad_accum_steps=accum, mix_prob=0., epochs=1).resolve()
        r = build_run(cfg, env)
        r.stop = SimpleNamespace(signum=None, requested=False); r.vote = StopVote(r.stop)  # what `fit` sets
        try: train_one_epoch(r)
        finally:
            if r.lock is not None: r.lock.release()
        return dict(step=r.state.step, schedule=r.state.schedule.last_step, weights=r.state.model.state_dict())
    finally: torch.set_default_dtype(old)


def main(folder, out):
    torch.set_num_threads(1)
    env = setup_distributed('cpu')
    assert env.world_size == 2 and dist.get_backend() == 'gloo', (env, dist.get_backend())
    res = dict(rank=env.rank, world_size=env.world_size, local_rank=env.local_rank)

    # 1. one forward/backward on half of a fixed batch each
    torch.manual_seed(0)
    model = create_model('t2t_vit_7', num_classes=4, img_size=16, **TINY)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    images, targets = fixed_batch()
    half = slice(4 * env.rank, 4 * env.rank + 4)
    loss = forward_backward(ddp, images[half], F.one_hot(targets[half], 4).float(), create_loss(True, 0.1))
    res['loss'] = (all_reduce_sum(loss.clone()) / env.world_size).item()
    res['grads'] = {n: p.grad.clone() for n, p in model.named_parameters()}

    # 2. the all-reduced evaluation metrics, on a shard of the validation split each
    _, val = create_datasets(folder, 16, 'digits')
    dl = create_loader(val, 5, sampler=ShardSampler(len(val), env.rank, env.world_size))
    res['eval'] = evaluate(model, dl, env.device)

    # 3. the loop's first optimizer step: each process takes its half of the global batch from the sampler
    cfg = config(folder, Path(out) / 'trainer', batch_size=4)
    r = build_run(cfg, env)
    r.sampler.set_epoch(0)
    images, targets, _ = next(iter(r.train_dl))
    train_step(r.state, r.model, images, targets, r.loss_fn, r.mixer, r.dtype)
    if r.lock is not None: r.lock.release()
    res['batch'] = all_gather_objects((images, targets))
    res['step1'] = {k: v.clone() for k, v in r.state.model.state_dict().items()}

    # 4. a whole (short) run: 2 processes x 4 images per step
    r = train(config(folder, Path(out) / 'run', batch_size=4))
    res['history'] = r.history
    # 5. gradient accumulation under DDP: 2 x 4 images per process and step against 8, in float64
    res['accum'] = [accumulation_run(folder, Path(out) / f'accum{n}', 8 // n, n, env) for n in (1, 2)]
    if env.is_main: torch.save(res, Path(out) / 'ddp.pt')
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    main(*sys.argv[1:3])
