"""The command lines (chapter 19, `t2t_course.train.cli`): `t2t_train`'s help (every flag with its default, the recipes'
defaults), bad arguments and setup errors as clear messages, bad weight files, --resume with flags left out or changed;
the ImageNet recipe end to end, a built-in dataset by name, T2T-ViT-14's paper recipe (slow); `t2t_eval` on our
checkpoints and on official-layout ones, and on bad input."""
import numpy as np
import pytest
import torch

from t2t_course.data import ImageFolderDataset, create_eval_transform
from t2t_course.models.t2t_vit import create_model
from t2t_course.train.cli import build_parser, eval_main, main

from tests.support.commands import PY, REPO, TINY_ARGS, call, no_traceback, run, train_args
from tests.support.images import make_folder
from tests.support.warm import warm_run


# ------------------------------------------------------------------ the help
def test_help_lists_every_flag_with_its_default():
    code, out, _ = call(main, ['--help'])
    assert code == 0
    for flag in ('--data', '--model', '--img-size', '--epochs', '--batch-size', '--lr', '--weight-decay', '--output',
                 '--resume', '--amp', '--compile', '--workers', '--seed', '--device', '--skip-bad-images'):
        assert flag in out, flag
    opts = [a for a in build_parser()._actions if a.option_strings and a.dest != 'help']
    assert all('default' in (a.help or '') for a in opts), [a.dest for a in opts if 'default' not in (a.help or '')]
    code, out, _ = call(eval_main, ['--help'])
    assert code == 0 and '--data' in out and '--model' in out


def test_help_shows_the_recipes_defaults():
    code, out, _ = call(main, ['--help'])
    assert code == 0
    flat = ' '.join(out.split())
    assert 'digits: 0.008;' in flat and 'a folder: 0.0005 (t2t_vit_7, t2t_vit_10, t2t_vit_12: 0.001)' in flat  # --lr
    assert 'fine-tuning (a folder and --pretrained): 0.4' in flat                                          # --lr, fine-tuning
    assert 'digits: 64;' in flat and 'a folder: the model\'s (224, 384)' in flat                         # --img-size
    assert "choose" not in flat and '{adamw,sgd}' in flat


# ------------------------------------------------------------------ bad arguments, bad files
@pytest.mark.parametrize('argv, message', [
    (['--epochs', '0'], 'epochs must be a positive int'),
    (['--model', 't2t_vit_13'], "unknown model 't2t_vit_13'"),
    (['--data', '/no/such/folder'], 'data folder /no/such/folder does not exist'),
    (['--lr', '-1'], 'lr must be a positive number'),
    (['--drop-path', '1.5'], 'drop_path must be in [0, 1)'),
    (['--amp', 'fp8'], "invalid choice: 'fp8'"),
    (['--resume', '/no/such.pth'], '/no/such.pth does not exist'),
    (['--model-kwargs', 'depth'], 'KEY=VALUE'),
    (['--warmup-epochs', '50', '--epochs', '10'], 'warmup_epochs must be in [0, epochs=10]'),
    (['--device', 'tpu'], "unknown device 'tpu'"),
])
def test_bad_arguments_get_clear_messages(argv, message):
    code, _, err = call(main, argv)
    assert code == 2 and message in err, err


def test_setup_errors_get_clear_messages(folder, tmp_path):
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '--batch-size', '1000', '--output', str(tmp_path / 'a')])
    assert code == 2 and 'fewer than one batch of 1000 per process' in err, err
    code, _, err = call(main, ['--data', str(folder / 'train'), *TINY_ARGS])
    assert code == 2 and 'has no train/ folder' in err, err
    (tmp_path / 'b').mkdir(); (tmp_path / 'b' / 'last.pth').write_bytes(b'x')
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '--output', str(tmp_path / 'b')])
    assert code == 2 and 'already holds a run' in err and '--resume auto' in err, err
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '--output', str(tmp_path / 'b'), '--resume', 'auto'])
    assert code == 2 and 'cannot read checkpoint' in err, err
    if not torch.cuda.is_available():
        code, _, err = call(main, ['--device', 'cuda'])
        assert code == 2 and 'no CUDA GPU' in err, err
        code, _, err = call(main, ['--amp', 'fp16', '--output', str(tmp_path / 'c')])
        assert code == 2 and "'fp16' needs a CUDA GPU" in err, err


def _saved(obj) -> bytes:
    import io; buf = io.BytesIO(); torch.save(obj, buf); return buf.getvalue()


@pytest.mark.parametrize('content, message', [(b'this is text, not weights\n', 'not a PyTorch checkpoint'),
                                               (b'', 'is empty (0 bytes)'),
                                               (_saved({'state_dict': {'w': torch.zeros(5000)}})[:3000], 'truncated or damaged'),
                                               (_saved({'state_dict': {}, 'best_acc1': np.float64(71.7)}), 'pickled numpy')])
def test_bad_pretrained_and_resume_files_get_one_line(folder, tmp_path, content, message):
    bad = tmp_path / 'weights.pth'; bad.write_bytes(content)
    code, _, err = call(main, train_args(folder, tmp_path / 'a', '--epochs', '1', '--pretrained', str(bad)))
    assert code == 2 and 'pretrained weights' in err and str(bad) in err and message in err, err
    code, _, err = call(main, train_args(folder, tmp_path / 'b', '--epochs', '1', '--resume', str(bad)))
    assert code == 2 and str(bad) in err and message in err, err
    assert 'weights_only=False' not in err  # never the unsafe advice for a file the user did not make
    for e in (err,): assert len(e.strip().splitlines()) == 1 and 'Traceback' not in e


# ------------------------------------------------------------------ resume
@pytest.mark.parametrize('case', ['flags forgotten', 'a flag changed', 'architecture changed', 'pipeline switched'])
def test_resume_takes_the_checkpoints_settings(case, tmp_path):
    "`--resume auto` with flags left out keeps the checkpoint's settings; a given flag that changes one is noted."
    from t2t_course.train.cli import main
    from t2t_course.train.checkpoint import read_checkpoint_dict
    data, out = make_folder(tmp_path / 'data', n_train=8, n_val=2), tmp_path / 'run'
    first = ['--data', str(data), *TINY_ARGS, '-b', '8', '--workers', '0', '--output', str(out), '--epochs', '1']
    code, _, err = call(main, [*first, '--weight-decay', '0.2', '--smoothing', '0.2', '--seed', '3', '--pipeline', 'pil'])
    assert code == 0, err
    again = ['--data', str(data), '--output', str(out), '--resume', 'auto', '--epochs', '2', '--no-progress', '--workers', '0']
    if case == 'flags forgotten':
        code, stdout, err = call(main, again)
        cfg = read_checkpoint_dict(out / 'last.pth')['config']
        assert code == 0, err
        assert (cfg['weight_decay'], cfg['smoothing'], cfg['seed'], cfg['pipeline'], cfg['epochs']) == (0.2, 0.2, 3, 'pil', 2)
        assert cfg['model_kwargs'] == {'embed_dim': 32, 'depth': 1, 'num_heads': 2, 'mlp_ratio': 2.0, 'token_dim': 16}
        note = next(line for line in stdout.splitlines() if 'note: resuming' in line)
        assert 'epochs 1 -> 2' in note and 'weight_decay' not in note and 'seed' not in note
    elif case == 'a flag changed':
        code, stdout, err = call(main, [*again, '--weight-decay', '0.05'])
        assert code == 0, err
        assert 'weight_decay 0.2 -> 0.05' in stdout and read_checkpoint_dict(out / 'last.pth')['config']['weight_decay'] == 0.05
    elif case == 'architecture changed':
        code, _, err = call(main, [*again, '--img-size', '32'])
        assert code == 2 and 'cannot resume' in err and 'img_size' in err and 'Traceback' not in err, err
    else:
        code, stdout, err = call(main, [*again, '--pipeline', 'draft'])
        assert code == 0 and 'pipeline pil -> draft' in stdout, err


# ------------------------------------------------------------------ t2t_train on other data
def test_imagenet_recipe_end_to_end_and_t2t_eval(folder, tmp_path):
    "The paper's preset (RandAugment, mixing, erasing, smoothing, EMA) on a tiny ImageNet-layout folder, then t2t_eval."
    out = tmp_path / 'run'
    code, stdout, err = call(main, ['--data', str(folder), *TINY_ARGS, '--img-size', '32', '--batch-size', '8', '--epochs', '2',
                                    '--workers', '1', '--output', str(out)])
    assert code == 0, err
    ck = torch.load(out / 'last.pth', weights_only=True)
    cfg = ck['config']
    assert cfg['data_preset'] == 'imagenet' and cfg['mix_prob'] == 1.0 and cfg['smoothing'] == 0.1
    assert cfg['lr'] == 1e-3 and cfg['weight_decay'] == 0.03  # t2t_vit_7's recipe, scaled to the global batch of 8:
    assert f'peak lr {1e-3 * 8 / 512:.3g}' in stdout
    last = ck['history'][-1]
    code, stdout, err = call(eval_main, [str(out / 'last.pth'), '--workers', '0'])
    assert code == 0, err
    assert f"top-1 {last['val_acc1']:6.2f}%" in stdout and f"top-1 {last['ema_val_acc1']:6.2f}%" in stdout
    assert '24 images, 4 classes' in stdout
    # fine-tuning from it (--pretrained); resuming it with another architecture is refused with a reason
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '--img-size', '32', '--batch-size', '8', '--epochs', '1',
                               '--workers', '0', '--pretrained', str(out / 'best.pth'), '--output', str(tmp_path / 'ft')])
    assert code == 0, err
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '--img-size', '32', '--model-kwargs', 'embed_dim=64', 'depth=1',
                               'num_heads=2', '--output', str(out), '--resume', 'auto'])
    assert code == 2 and "cannot resume" in err and 'model_kwargs' in err, err


def test_builtin_dataset_by_name_and_sgd(tmp_path):
    "--data digits names the registered dataset; --opt sgd swaps the optimizer (one registry entry each)."
    out = tmp_path / 'run'
    code, _, err = call(main, ['--data', 'digits', '--epochs', '1', '--opt', 'sgd', '--lr', '0.4', '--model-kwargs',
                               'embed_dim=32', 'depth=1', 'num_heads=2', 'mlp_ratio=2.0', 'token_dim=16', '--img-size', '16',
                               '--no-progress', '--output', str(out)])
    assert code == 0, err
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert ck['config']['data'] == 'digits' and ck['config']['opt'] == 'sgd'
    assert 'momentum' in ck['optimizer']['param_groups'][0] and 'betas' not in ck['optimizer']['param_groups'][0]


@pytest.mark.slow
def test_t2t_vit_14_paper_recipe_on_a_tiny_imagenet(tmp_path):
    "`t2t_train --data FOLDER --model t2t_vit_14`: the real model at 224 px, one epoch of two steps on the CPU."
    root = make_folder(tmp_path / 'inet', n_train=2, n_val=1, classes=4, size=(240, 260), ext='.JPEG')
    code, stdout, err = call(main, ['--data', str(root), '--model', 't2t_vit_14', '--epochs', '1', '--batch-size', '4',
                                    '--workers', '0', '--no-progress', '--output', str(tmp_path / 'run')])
    assert code == 0, err
    assert 'global batch 4' in stdout and f'peak lr {5e-4 * 4 / 512:.3g}' in stdout and '224 px' in stdout


# ------------------------------------------------------------------ t2t_eval
def test_t2t_eval_on_an_official_layout_checkpoint(tmp_path):
    "The golden file's official state_dict (module. prefixes, EMA wrapping) through t2t_eval, against a hand evaluation."
    g = torch.load(REPO / 'reference' / 'golden' / 'tiny_performer_64.pt', weights_only=True)
    sd = g['state_dict']
    ck = {'state_dict': {'module.' + k: v for k, v in sd.items()}, 'state_dict_ema': sd, 'epoch': 299}
    torch.save(ck, tmp_path / 'official.pth.tar')
    root = make_folder(tmp_path / 'ten', n_train=1, n_val=2, classes=10, size=(70, 80))
    args = [str(tmp_path / 'official.pth.tar'), '--data', str(root), '--model', 't2t_vit_7', '--model-kwargs', 'embed_dim=64',
            'depth=2', 'num_heads=2', 'mlp_ratio=2.0', '--img-size', '64', '--workers', '0']
    code, stdout, err = call(eval_main, args)
    assert code == 0, err
    model = create_model('t2t_vit_7', num_classes=10, img_size=64, embed_dim=64, depth=2, num_heads=2, mlp_ratio=2.).eval()
    model.load_state_dict(sd)
    ds = ImageFolderDataset(root / 'val', create_eval_transform(64, crop_pct=0.9, interpolation='bicubic'))
    with torch.no_grad():
        logits = model(torch.stack([ds[i][0] for i in range(len(ds))]))
    y = torch.tensor(ds.targets)
    acc1 = 100 * (logits.argmax(1) == y).float().mean().item()
    acc5 = 100 * (logits.topk(5, 1).indices == y[:, None]).any(1).float().mean().item()
    assert stdout.count(f'top-1 {acc1:6.2f}%  top-5 {acc5:6.2f}%') == 2  # weights and EMA (the same tensors here)
    code, _, err = call(eval_main, args[:3] + ['--workers', '0'])
    assert code == 2 and 'name its architecture with --model' in err
    three = make_folder(tmp_path / 'three', n_train=1, n_val=1, classes=3)
    code, _, err = call(eval_main, [a if a != str(root) else str(three) for a in args])
    assert code == 2 and 'has 3 class folders but the checkpoint\'s head has 10 classes' in err, err


def test_t2t_eval_caps_workers_and_prints_top5_only_when_it_means_something(folder, tmp_path):
    out = tmp_path / 'run'
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '-b', '8', '--epochs', '1', '--output', str(out)])
    assert code == 0, err
    p = run(['-m', 't2t_course.train.cli', '--help'])  # the module runs as t2t_train too
    assert p.returncode == 0 and 'usage: t2t_train' in p.stdout
    code = 'import sys; from t2t_course.train.cli import eval_main; sys.exit(eval_main(sys.argv[1:]))'
    p = warm_run([PY, '-W', 'default', '-c', code, str(out / 'last.pth')], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert 'suggested max number of worker' not in p.stderr  # no more workers than CPUs
    assert 'top-1' in p.stdout and 'top-5' not in p.stdout    # 4 classes: top-5 would be 100% by definition


def test_t2t_eval_bad_input(folder, tmp_path):
    out = tmp_path / 'run'
    code, _, err = call(main, train_args(folder, out, '--epochs', '1'))
    assert code == 0, err
    (tmp_path / 'no_val' / 'train' / 'n00').mkdir(parents=True)
    code, _, err = call(eval_main, [str(out / 'last.pth'), '--data', str(tmp_path / 'no_val'), '--workers', '0'])
    assert code == 2 and 'has no val/ folder' in err, err
    code, _, err = call(eval_main, [str(out / 'last.pth'), '--img-size', '7'])
    assert code == 2 and '--img-size must be an int >= 16' in err, err
    code, _, err = call(eval_main, [str(out / 'last.pth'), '--model', 't2t_vit_14', '--workers', '0'])
    assert code == 2 and "was trained as t2t_vit_7 with {'embed_dim': 32" in err and "own architecture" in err, err
    (tmp_path / 'text.pth').write_text('hello')
    p = run(['-c', 'import sys; from t2t_course.train.cli import eval_main; sys.exit(eval_main(sys.argv[1:]))', str(tmp_path / 'text.pth'),
             '--model', 't2t_vit_7', '--data', str(folder)])
    assert p.returncode == 2 and 'not a PyTorch checkpoint' in p.stderr, p.stderr
    no_traceback(p.stderr)


# ------------------------------------------------------------------ model folders: t2t_eval on one, --pretrained one
def test_t2t_eval_and_pretrained_take_a_model_folder(folder, tmp_path):
    """A run's best_model/: t2t_eval on it (with --data) gives the best epoch's EMA accuracy; `t2t_train --pretrained` it
    needs no --model (the folder names its architecture and arguments, which the new run's config records)."""
    code, _, err = call(main, train_args(folder, tmp_path / 'a', '--epochs', '2', '--ema-decay', '0.9'))
    assert code == 0, err
    history = torch.load(tmp_path / 'a' / 'best.pth', weights_only=True)['history']
    best = max(history, key=lambda h: max(h['val_acc1'], h['ema_val_acc1']))
    code, out, err = call(eval_main, [str(tmp_path / 'a' / 'best_model'), '--data', str(folder), '--workers', '0'])
    assert code == 0 and f"top-1 {best['ema_val_acc1']:6.2f}%" in out and 'EMA' not in out, (out, err)
    code, _, err = call(eval_main, [str(tmp_path / 'a' / 'best_model')])
    assert code == 2 and 'pass the validation folder with --data' in err
    code, _, err = call(eval_main, [str(tmp_path / 'a' / 'best_model'), '--data', str(folder), '--model', 't2t_vit_14'])
    assert code == 2 and "holds a t2t_vit_7: t2t_eval uses a model folder's own architecture; drop --model" in err
    args = ['--data', str(folder), '--pretrained', str(tmp_path / 'a' / 'best_model'), '--img-size', '16', '--threads', '1',
            '--no-progress', '-b', '8', '--workers', '0', '--epochs', '1', '--output', str(tmp_path / 'b')]
    code, out, err = call(main, args)
    assert code == 0, err
    cfg = torch.load(tmp_path / 'b' / 'last.pth', weights_only=True)['config']
    assert (cfg['model'], cfg['model_kwargs']) == ('t2t_vit_7', dict(embed_dim=32, depth=1, num_heads=2, mlp_ratio=2.0, token_dim=16))
    code, _, err = call(eval_main, [str(tmp_path / 'b' / 'last.pth'), '--workers', '0'])
    assert code == 0, err


def test_pretrained_safetensors_file(folder, tmp_path):
    from t2t_course.models.weights import save_safetensors
    from tests.support.commands import TINY
    save_safetensors(create_model('t2t_vit_7', img_size=16, num_classes=4, **TINY).state_dict(), tmp_path / 'w.safetensors')
    code, _, err = call(main, train_args(folder, tmp_path / 'run', '--epochs', '1', '--pretrained', str(tmp_path / 'w.safetensors')))
    assert code == 0, err
    (tmp_path / 'bad.safetensors').write_bytes(b'\x10\x00\x00\x00\x00\x00\x00\x00not json')
    code, _, err = call(main, train_args(folder, tmp_path / 'run2', '--epochs', '1', '--pretrained', str(tmp_path / 'bad.safetensors')))
    assert code == 2 and 'not a safetensors file, or a truncated or damaged one' in err, err
