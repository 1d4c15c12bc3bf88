"""The command lines (chapter 19, `t2t_course.train.cli`): `t2t_train`'s help (every flag with its default, the recipes'
defaults), bad arguments and setup errors as clear messages, bad weight files, --resume with flags left out or changed;
the ImageNet recipe end to end, a built-in dataset by name, T2T-ViT-14's paper recipe (slow); `t2t_eval` on our
checkpoints and on official-layout ones, and on bad input. What users feed the commands: checkpoints that read but
are unusable (one line in t2t_eval, --pretrained and --resume), runs that cannot fit (refused under an address-space
cap before the model is built), an out-of-memory error during the run (one line, last.pth resumable), model names and
--model-kwargs of the wrong kind, fewer than two classes, Ctrl-C."""
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
        # what the recipe chose (the warm-up, a share of the epochs) it chooses again for the new --epochs
        from t2t_course.train.config import TrainConfig
        warmup = lambda epochs: TrainConfig(data=str(data), epochs=epochs, device='cpu').resolve().warmup_epochs
        assert cfg['warmup_epochs'] == warmup(2) != warmup(1)
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


# ------------------------------------------------------------------ what users feed the commands (issue 47)
@pytest.fixture(scope='module')
def run_ck(folder, tmp_path_factory):
    "A tiny run's last.pth, trained once for the tests below."
    out = tmp_path_factory.mktemp('run47')
    code, _, err = call(main, train_args(folder, out, '--epochs', '1'))
    assert code == 0, err
    return out / 'last.pth'


def _bad(ck:dict, case:str) -> dict:
    "Our checkpoint `ck`, damaged as `case` says."
    sd = dict(ck['state_dict'])
    if case == 'values not tensors': return dict(ck, state_dict=dict(sd, cls_token=5))
    if case == 'a key not a string': return dict(ck, state_dict={1: torch.zeros(3), **sd})
    if case == 'one NaN': return dict(ck, state_dict=dict(sd, **{'head.bias': sd['head.bias'].clone().index_fill_(0, torch.tensor([0]), float('nan'))}))
    if case == 'every tensor int64': return dict(ck, state_dict={k: v.long() for k, v in sd.items()}, state_dict_ema=None)
    if case == 'classes None': return dict(ck, classes=None)
    if case == 'fewer class names': return dict(ck, classes=ck['classes'][:2])
    if case == 'a meta tensor': return dict(ck, state_dict=dict(sd, **{'head.weight': torch.empty(sd['head.weight'].shape, device='meta')}))
    raise ValueError(case)

BAD = {'values not tensors': 'cls_token is a int, not a tensor', 'a key not a string': 'key 1 is a int, not a name',
       'one NaN': 'head.bias holds 1 NaN or infinite values', 'every tensor int64': 'is torch.int64 where the model has torch.float32',
       'classes None': 'has classes=None for a head of 4 outputs', 'fewer class names': 'has 2 class names for a head of 4 outputs',
       'a meta tensor': 'head.weight is a meta tensor'}


@pytest.mark.parametrize('case', list(BAD))
def test_malformed_checkpoints_are_one_line_everywhere(folder, run_ck, tmp_path, case):
    "t2t_eval, --pretrained and --resume refuse a checkpoint that reads but is not usable: one line naming the entry, exit 2."
    ck = torch.load(run_ck, weights_only=True)
    bad = tmp_path / 'bad.pth'
    torch.save(_bad(ck, case), bad)
    for fn, argv in ((eval_main, [str(bad), '--workers', '0']),
                     (main, train_args(folder, tmp_path / 'p', '--epochs', '1', '--pretrained', str(bad))),
                     (main, train_args(folder, tmp_path / 'r', '--epochs', '2', '--resume', str(bad)))):
        code, _, err = call(fn, argv)
        assert code == 2 and BAD[case] in err and str(bad) in err, (argv[:2], err)
        assert len(err.strip().splitlines()) == 1 and 'Traceback' not in err, err


def test_half_precision_checkpoint_is_widened_with_a_note(run_ck, tmp_path):
    ck = torch.load(run_ck, weights_only=True)
    torch.save(dict(ck, state_dict={k: v.half() for k, v in ck['state_dict'].items()}), tmp_path / 'half.pth')
    code, out, err = call(eval_main, [str(tmp_path / 'half.pth'), '--workers', '0'])
    assert code == 0 and 'top-1' in out, err


def test_wrong_architecture_for_pretrained_is_complete_on_its_first_line(folder, tmp_path):
    from tests.support.commands import TINY
    torch.save(create_model('t2t_vit_7', img_size=16, num_classes=4, **dict(TINY, depth=2)).state_dict(), tmp_path / 'w.pth')
    code, _, err = call(main, train_args(folder, tmp_path / 'run', '--epochs', '1', '--pretrained', str(tmp_path / 'w.pth')))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert 'does not fit this T2TViT (t2t_vit_7): it looks like performer T2T layers, embed_dim 32, depth 2 (11 not in the model)' in err, err
    assert not err.rstrip().endswith(':'), err


@pytest.mark.parametrize('fn, argv', [(main, ['--model', 't2t_vit7']), (eval_main, ['x.pth', '--model', 't2t_vit7'])])
def test_model_names_get_did_you_mean(fn, argv):
    code, _, err = call(fn, argv)
    assert code == 2 and "unknown model 't2t_vit7'; did you mean 't2t_vit_7'" in err, err


@pytest.mark.parametrize('kw, message', [('depth=abc', "depth='abc': depth takes an int"), ('dept=3', "takes no argument 'dept'"),
                                         ('qkv_bias=3', 'qkv_bias takes True or False')])
def test_model_kwargs_of_the_wrong_kind(kw, message):
    code, _, err = call(main, ['--model', 't2t_vit_7', '--model-kwargs', kw])
    assert code == 2 and message in err and 'linspace' not in err, err


def test_training_needs_two_classes_and_names_hidden_folders(tmp_path):
    root = make_folder(tmp_path / 'two', n_train=2, n_val=1, classes=2)
    classes = sorted(p.name for p in (root / 'train').iterdir())
    for split in ('train', 'val'): (root / split / classes[1]).rename(root / split / ('.' + classes[1]))
    code, _, err = call(main, ['--data', str(root), *TINY_ARGS, '--epochs', '1', '--output', str(tmp_path / 'o')])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"has 1 class folder ({classes[0]}): training a classifier needs at least 2; skipped .{classes[1]}" in err, err


def _capped(code:str, *args, extra_gb:float=3.0):
    "Run `code` in a child Python whose address space is capped at what it maps after importing the commands + `extra_gb`."
    import subprocess, sys
    prelude = ("import resource, sys\nimport t2t_course.train.cli\n"
               "vm = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) * 1024\n"
               f"cap = vm + int({extra_gb} * 2**30); resource.setrlimit(resource.RLIMIT_AS, (cap, cap))\n")
    return subprocess.run([sys.executable, '-c', prelude + code, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=dict(__import__('os').environ, PYTHONWARNINGS='ignore'))


def test_a_run_that_cannot_fit_is_refused_before_the_model_is_built(tmp_path):
    "--img-size 100000 and 4096 x 8, under an address-space cap: one line with the estimate, the limit and what fits; exit 2."
    import time
    for extra in (['--img-size', '100000'], ['--img-size', '4096', '--batch-size', '8']):
        t = time.perf_counter()
        p = _capped("from t2t_course.train.cli import main; sys.exit(main(sys.argv[1:]))", '--output', tmp_path / 'o', '--epochs', '1', *extra)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr[-2000:]
        assert f"--img-size {extra[1]} with --batch-size" in p.stderr and "RLIMIT_AS" in p.stderr and 'try --' in p.stderr, p.stderr
        assert time.perf_counter() - t < 60


OOM = {'gpu-simulated': "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')",
       'numpy': "import numpy as np; np.empty(2**36)",
       'cpu': "torch.empty(2**44, dtype=torch.uint8)"}

@pytest.mark.parametrize('kind', list(OOM))
def test_out_of_memory_is_one_line_and_the_last_epoch_resumes(folder, tmp_path, kind):
    "An allocator's error in epoch 2 (CUDA's simulated, NumPy's and the CPU allocator's real, under a cap): one line naming the size and batch, exit 1; last.pth of epoch 1 intact and resumable."
    child = ("import torch\nfrom t2t_course.train.callbacks import Callback\nfrom t2t_course.train.cli import main\n"
             "class Oom(Callback):\n    def after_step(self, run):\n"
             f"        if run.state.epoch == 1 and run.state.batch == 1: {OOM[kind]}\n"
             "sys.exit(main(sys.argv[1:], callbacks=[Oom()]))")
    out = tmp_path / 'run'
    p = _capped(child, *train_args(folder, out, '--epochs', '2'))
    assert p.returncode == 1, p.stderr[-3000:]
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and 'out of memory at --img-size 16 with --batch-size 8' in err[0] and str(out) in err[0], p.stderr[-3000:]
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert (ck['epoch'], ck['batch']) == (1, 0)  # the end of epoch 1, as saved
    code, _, e = call(main, train_args(folder, out, '--epochs', '2', '--resume', 'auto'))
    assert code == 0, e
    assert torch.load(out / 'last.pth', weights_only=True)['epoch'] == 2


def test_ctrl_c_in_t2t_eval_is_one_line(run_ck, monkeypatch):
    import t2t_course.train.cli as cli
    def stop(*a, **k): raise KeyboardInterrupt
    monkeypatch.setattr(cli, 'evaluate_checkpoint', stop)
    code, _, err = call(eval_main, [str(run_ck)])
    assert code == 130 and 'interrupted' in err and len(err.strip().splitlines()) == 1, err


def test_out_of_memory_in_t2t_eval_is_one_line(run_ck, monkeypatch):
    import t2t_course.train.cli as cli
    def oom(*a, **k): raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')
    monkeypatch.setattr(cli, 'evaluate_checkpoint', oom)
    code, _, err = call(eval_main, [str(run_ck), '--batch-size', '512'])
    assert code == 1 and 'out of memory' in err and '--batch-size 512' in err and len(err.strip().splitlines()) == 1, err


def test_the_memory_check_names_what_fits_and_can_be_skipped(monkeypatch):
    from t2t_course.core import SetupError
    from t2t_course.train.cli import check_memory
    from t2t_course.train.config import TrainConfig
    cfg = TrainConfig(model='t2t_vit_14', img_size=224, batch_size=64, ema_decay=0.).resolve()  # not the digits' small model
    with pytest.raises(SetupError, match=r"more than the 2.0 GB this process may use \(a made-up limit\): try --batch-size \d+ or --img-size \d+"):
        check_memory(cfg, usable=(2 * 2**30, 'a made-up limit'))
    assert check_memory(cfg, usable=(2**40, 'plenty'))['train'] > 0
    monkeypatch.setenv('T2T_COURSE_MEMORY_CHECK', '0')
    assert check_memory(cfg, usable=(1, 'nothing')) == {}


def test_t2t_eval_of_another_architecture_is_one_line(run_ck):
    code, _, err = call(eval_main, [str(run_ck), '--model', 't2t_vit_14', '--workers', '0'])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    ck = torch.load(run_ck, weights_only=True)
    import tempfile, os
    with tempfile.TemporaryDirectory() as d:
        torch.save({'state_dict': ck['state_dict']}, os.path.join(d, 'foreign.pth'))
        code, _, err = call(eval_main, [os.path.join(d, 'foreign.pth'), '--model', 't2t_vit_14', '--data', ck['config']['data'], '--workers', '0'])
    assert code == 2 and len(err.strip().splitlines()) == 1 and 'does not fit this T2TViT (t2t_vit_14): it looks like' in err, err
