"""Distributed training (chapter 14, `t2t_course.train.distributed`): DDP under torchrun (two CPU processes on gloo)
against a single process on the combined batch; a sample's load never reseeds a generator; every CPU DDP launch of the
tests and chapters stays on the CPU; two processes started as torchrun starts them, with a hung or dead peer (one clear
line, within --dist-timeout) or a signal to one of them (both stop within a step); NCCL on every visible GPU (marked
`cuda`)."""
import json, math, os, socket, subprocess, sys, time

import pytest
import torch
import torch.nn.functional as F

from t2t_course.data import create_loss, digits_folder
from t2t_course.data.pipelines import create_pipeline
from t2t_course.models.t2t_vit import create_model
from t2t_course.train import train
from t2t_course.train.distributed import SeededDataset

from tests.support.commands import FAULT, PY, REPO, max_diff, no_traceback, run, train_args
from tests.support.warm import WarmPopen


# ------------------------------------------------------------------ DDP against one process
def test_ddp_matches_a_single_process_on_the_combined_batch(folder, tmp_path):
    from tests.support.ddp_worker import TINY as DTINY, fixed_batch
    p = run(['-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port', str(29500 + os.getpid() % 1000),
             '-m', 'tests.support.ddp_worker', str(folder), str(tmp_path)], env={'OMP_NUM_THREADS': '1'})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ddp = torch.load(tmp_path / 'ddp.pt', weights_only=False)
    assert (ddp['world_size'], ddp['rank']) == (2, 0)
    # one step: the whole batch in one process
    torch.manual_seed(0)
    model = create_model('t2t_vit_7', num_classes=4, img_size=16, **DTINY)
    images, targets = fixed_batch()
    loss = create_loss(True, 0.1)(model(images), F.one_hot(targets, 4).float())
    loss.backward()
    assert abs(loss.item() - ddp['loss']) < 1e-5
    assert max_diff({n: p.grad for n, p in model.named_parameters()}, ddp['grads']) < 1e-5
    # evaluation: the all-reduced metrics of two shards equal those of the whole split
    from t2t_course.data import create_datasets, create_loader
    from t2t_course.train.evaluate import evaluate
    _, val = create_datasets(folder, 16, 'digits')
    single = evaluate(model, create_loader(val, 7), torch.device('cpu'))
    assert single['n'] == ddp['eval']['n'] == len(val) and single['acc1'] == ddp['eval']['acc1']
    assert single['acc5'] == ddp['eval']['acc5'] and math.isclose(single['loss'], ddp['eval']['loss'], rel_tol=1e-6)
    # the loop's first step: the two halves from the samplers make up the single process's batch, same update
    from tests.support.ddp_worker import config
    from t2t_course.train import build_run, train_step
    r = build_run(config(folder, tmp_path / 'trainer', batch_size=8))
    r.sampler.set_epoch(0)
    images, targets, _ = next(iter(r.train_dl))
    (i0, t0), (i1, t1) = ddp['batch']
    torch.testing.assert_close(torch.cat([i0, i1]), images[[0, 2, 4, 6, 1, 3, 5, 7]], rtol=0, atol=0)
    assert torch.equal(torch.cat([t0, t1]), targets[[0, 2, 4, 6, 1, 3, 5, 7]])
    train_step(r.state, r.model, images, targets, r.loss_fn, r.mixer, r.dtype)
    r.lock.release()
    assert max_diff(r.state.model.state_dict(), ddp['step1']) < 1e-5
    # a whole run under torchrun: rank 0 wrote the files; its logged metrics are those of its weights on the whole split.
    # (The weights are not compared after many steps: Adam's first updates are lr * sign(g), so gradients that are 0
    # up to rounding flip and the two runs drift apart by ~lr per step, however exact the reduction.)
    run_dir = tmp_path / 'run'
    assert {'last.pth', 'best.pth', 'metrics.csv', 'curves.png'} <= {p.name for p in run_dir.iterdir()}
    ck = torch.load(run_dir / 'last.pth', weights_only=True)
    assert ck['world_size'] == 2 and len(ck['rng']) == 2 and ck['step'] == 2 * 8
    model.load_state_dict(ck['state_dict'])
    m = evaluate(model, create_loader(val, 7), torch.device('cpu'))
    h = ddp['history'][-1]
    assert (h['val_acc1'], h['val_acc5']) == (m['acc1'], m['acc5']) and math.isclose(h['val_loss'], m['loss'], rel_tol=1e-5)
    r = train(config(folder, tmp_path / 'single', batch_size=8))
    assert math.isclose(r.history[0]['train_loss'], ddp['history'][0]['train_loss'], rel_tol=1e-3)
    # gradient accumulation under DDP (no_sync on the first batch of each step): the same weights as the doubled batch
    whole, acc = ddp['accum']
    assert (whole['step'], acc['step'], acc['schedule']) == (4, 4, 4)
    assert max_diff(whole['weights'], acc['weights']) < 1e-10


@pytest.mark.parametrize('pipeline', ['pil', 'draft', 'fast'])
def test_a_sample_load_never_reseeds_and_leaves_the_generator(pipeline, monkeypatch):
    "SeededDataset seeds only the CPU generator, inside fork_rng: no torch.manual_seed / cuda.manual_seed*, state restored."
    p = create_pipeline(pipeline, digits_folder(), 32, 'imagenet')  # the full recipe: every draw of a sample
    sds = SeededDataset(p.train, seed=3)
    calls = []
    for mod, name in [(torch, 'manual_seed'), (torch.random, 'manual_seed'), (torch.cuda, 'manual_seed'),
                      (torch.cuda, 'manual_seed_all'), (torch.cuda.random, 'manual_seed'), (torch.cuda.random, 'manual_seed_all')]:
        monkeypatch.setattr(mod, name, lambda *a, _n=f'{mod.__name__}.{name}', **k: calls.append(_n))
    torch.default_generator.manual_seed(123); torch.rand(7)
    before = torch.get_rng_state()
    a = sds[(2, 5)][0]
    assert torch.equal(torch.get_rng_state(), before) and calls == [], calls
    torch.rand(50)
    b = sds[(2, 5)][0]  # the same sample whatever was drawn before (fast: uint8 pixels and the erasing it drew)
    assert torch.equal(b, a) if torch.is_tensor(a) else (torch.equal(b[0], a[0]) and str(b[1]) == str(a[1]))


def test_every_cpu_ddp_launch_pins_the_cpu(monkeypatch, tmp_path):
    "The DDP runs of the tests and of chapter 18d's slow cell say device='cpu': on a GPU machine they must stay on gloo."
    from tests.support.ddp_worker import config
    assert config(digits_folder(), '/tmp/unused', 4).device == 'cpu'
    cells = json.loads((REPO / 'nbs' / '18d_loop.ipynb').read_text())['cells']
    ddp = [''.join(c['source']) for c in cells if 'torch.distributed.run' in ''.join(c['source'])]
    assert ddp and all("device='cpu'" in src for src in ddp)
    started = []
    class Popen:
        def __init__(self, cmd, **kw): started.append(cmd)
    monkeypatch.setattr(sys.modules[__name__], 'WarmPopen', Popen)
    two_processes('none', ['--epochs', '1'], tmp_path)  # the fault tests' launcher adds the device
    assert len(started) == 2 and all(c[c.index('--device') + 1] == 'cpu' for c in started), started


# ------------------------------------------------------------------ two processes and their faults
def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]


def two_processes(fault, args, tmp_path, launcher='torchrun'):
    "Start a 2-process gloo run as torchrun (or SLURM's srun, one task each) would (the environment), without either."
    if '--device' not in args: args = [*args, '--device', 'cpu']  # gloo on the CPU, on a GPU machine too
    port, procs = _free_port(), []
    for rank in (0, 1):
        where = (dict(WORLD_SIZE='2', RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE='2', MASTER_ADDR='127.0.0.1')
                 if launcher == 'torchrun' else  # srun: SLURM's variables; the host from the node list, the port given
                 dict(SLURM_NTASKS='2', SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NODEID='0',
                      SLURM_JOB_ID='4242', SLURM_JOB_NODELIST='localhost', SLURM_TASKS_PER_NODE='2'))
        env = dict({k: v for k, v in os.environ.items() if not k.startswith('SLURM_')}, **where, MASTER_PORT=str(port),
                   OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
        procs.append(WarmPopen([PY, *FAULT, fault, '--', *args], cwd=REPO, env=env, text=True,
                                stdout=open(tmp_path / f'out{rank}.txt', 'w'), stderr=open(tmp_path / f'err{rank}.txt', 'w')))
    return procs


def _finish(procs, timeout, grace:float=0.):
    "Wait for rank 0; give the others `grace` seconds more to exit on their own, then kill what is left."
    try: return procs[0].wait(timeout=timeout)
    finally:
        for p in procs:
            try: p.wait(timeout=grace)
            except subprocess.TimeoutExpired: pass
            if p.poll() is None: p.kill(); p.wait()


def _metrics(path):
    "metrics.csv without its timings."
    import csv
    return [{k: v for k, v in row.items() if k not in ('epoch_time_s', 'train_images_per_s')} for row in csv.DictReader(open(path))]


def test_slurm_tasks_train_as_torchrun_processes_do(folder, tmp_path):
    "Two processes started with SLURM's variables (srun, one task each) train as torchrun's two do: the same metrics.csv."
    args = ['--epochs', '2', '--deterministic', '--mix-prob', '0']
    for launcher in ('torchrun', 'slurm'):
        out = tmp_path / launcher
        procs = two_processes('none', train_args(folder, out, *args), tmp_path, launcher)
        assert _finish(procs, timeout=200, grace=30) == 0 and procs[1].returncode == 0, (tmp_path / 'err0.txt').read_text()[-3000:]
        assert '2 process(es) on cpu, global batch 16' in (tmp_path / 'out0.txt').read_text()
    assert _metrics(tmp_path / 'slurm' / 'metrics.csv') == _metrics(tmp_path / 'torchrun' / 'metrics.csv')


def test_a_lone_slurm_task_is_one_process(folder, tmp_path, monkeypatch):
    "SLURM_NTASKS=1 (a job script run as one task, or srun -n 1): one process, no process group."
    from t2t_course.train.cli import main
    from tests.support.commands import call
    for k, v in dict(SLURM_NTASKS='1', SLURM_PROCID='0', SLURM_LOCALID='0', SLURM_JOB_ID='7', SLURM_JOB_NODELIST='node01').items():
        monkeypatch.setenv(k, v)
    code, out, err = call(main, train_args(folder, tmp_path / 'run', '--epochs', '1'))
    assert code == 0 and '1 process(es) on cpu, global batch 8' in out, err


@pytest.mark.parametrize('fault', ['stop@1:3', 'kill@1:3'])  # a hung peer (SIGSTOP), a dead one (SIGKILL)
def test_a_lost_peer_gets_one_clear_line(folder, tmp_path, fault):
    args = train_args(folder, tmp_path / 'run', '--epochs', '3', '--dist-timeout', '10', '--device', 'cpu', '-b', '4')
    t = time.perf_counter()
    procs = two_processes(fault, args, tmp_path)
    code = _finish(procs, timeout=150)
    err = (tmp_path / 'err0.txt').read_text()
    assert code == 1, err[-3000:]
    assert 'rank 0: a collective of the training loop' in err and 'died or stopped responding' in err and '--resume auto' in err, err
    no_traceback(err)
    assert time.perf_counter() - t < 120  # bounded by --dist-timeout, not torch's 30 minutes


def test_sigterm_to_one_process_stops_both_within_a_step(folder, tmp_path):
    "The stop vote runs after every step: a signal at step 3 of an 8-step epoch stops both at step 4 (one step late)."
    out = tmp_path / 'run'
    procs = two_processes('signal@1:3', train_args(folder, out, '--epochs', '3', '--device', 'cpu', '-b', '4'), tmp_path)
    code = _finish(procs, timeout=150, grace=60)  # rank 1 also saves and exits: not killed the moment rank 0 is done
    assert code == 143 and procs[1].returncode == 143, (tmp_path / 'err0.txt').read_text()[-3000:]
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert (ck['epoch'], ck['batch'], ck['step']) == (0, 4, 4) and len(ck['rng']) == 2
    assert 'stopped by SIGTERM in epoch 1 after 4 of its 8 steps' in (tmp_path / 'out0.txt').read_text()


# ------------------------------------------------------------------ GPU
@pytest.mark.cuda
def test_ddp_nccl_on_every_visible_gpu(tmp_path):
    "One process per visible GPU on NCCL: an all-reduce, a DDP step equal to the combined batch's, and (2+ GPUs) a train() run."
    from tests.support.images import make_folder
    from tests.support.nccl_worker import TINY as NTINY
    from t2t_course.models.t2t_vit import create_model
    from t2t_course.data import create_loss
    n = torch.cuda.device_count()
    folder = make_folder(tmp_path / 'data')
    p = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', str(n), '--master_port',
                        str(29600 + os.getpid() % 1000), '-m', 'tests.support.nccl_worker', str(folder), str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    got = torch.load(tmp_path / 'nccl.pt', weights_only=False)
    assert got['world'] == n
    torch.manual_seed(0)
    model = create_model('t2t_vit_7', num_classes=4, img_size=16, **NTINY)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2 * n, 3, 16, 16, generator=g), torch.randint(0, 4, (2 * n,), generator=g)
    create_loss(True, 0.1)(model(x), F.one_hot(y, 4).float()).backward()
    for name, prm in model.named_parameters(): torch.testing.assert_close(got['grads'][name], prm.grad, rtol=1e-4, atol=1e-5)
