"""Checkpoints and a run's folder (chapter 15, `t2t_course.train.checkpoint`): a second run on a folder in use is
refused, and a dead run's lock file does not block; the temporaries of killed saves are removed; an output that is a
file, unwritable, or on a full disk is one line naming the cause, and the previous checkpoint is kept. No command prints
a Python traceback on any of them, and nothing a run trained is lost."""
import os, resource, signal, socket, subprocess, time

import torch

from t2t_course.train.cli import main

from tests.support.commands import PY, REPO, call, no_traceback, train_args
from tests.support.warm import WarmPopen, warm_run


# ------------------------------------------------------------------ a run's folder in use
def _wait_for(path, proc, timeout=120):
    deadline = time.time() + timeout
    while not path.exists() and time.time() < deadline and proc.poll() is None: time.sleep(0.1)
    assert path.exists(), proc.communicate(timeout=30)


def test_a_second_run_on_the_same_folder_is_refused(folder, tmp_path):
    out = tmp_path / 'run'
    first = WarmPopen([PY, '-m', 't2t_course.train', *train_args(folder, out, '--epochs', '1000')], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(out / 'last.pth', first)
        for extra in ([], ['--resume', 'auto']):
            code, _, err = call(main, train_args(folder, out, '--epochs', '2', *extra))
            assert code == 2 and f'output folder {out} is in use by another run (pid {first.pid} on {socket.gethostname()}' in err, err
            no_traceback(err)
    finally:
        first.send_signal(signal.SIGTERM); first.communicate(timeout=60)
    assert first.returncode == 143
    code, _, err = call(main, train_args(folder, out, '--epochs', '2', '--resume', 'auto'))  # the lock died with its holder
    assert code == 0, err


def test_a_lock_file_left_by_a_dead_run_does_not_block(folder, tmp_path):
    out = tmp_path / 'run'; out.mkdir()
    (out / '.lock').write_text('{"pid": 999999, "host": "elsewhere", "since": "yesterday"}')
    code, _, err = call(main, train_args(folder, out, '--epochs', '1'))
    assert code == 0, err


def test_stale_temporaries_of_killed_saves_are_removed(folder, tmp_path):
    out = tmp_path / 'run'; out.mkdir()
    (out / '.last.pth.4242.tmp').write_bytes(b'\0' * 2_000_000)  # a partial write of a process killed by -9
    code, stdout, err = call(main, train_args(folder, out, '--epochs', '1'))
    assert code == 0, err
    assert 'removed 1 temporary file(s) of interrupted writes' in stdout and '.last.pth.4242.tmp' in stdout
    assert not list(out.glob('.*.tmp'))


# ------------------------------------------------------------------ outputs that cannot be written
def test_output_that_is_a_file_or_under_a_file(folder, tmp_path):
    (tmp_path / 'a_file').write_text('x')
    code, _, err = call(main, train_args(folder, tmp_path / 'a_file', '--epochs', '1'))
    assert code == 2 and 'is a file, not a folder' in err, err
    code, _, err = call(main, train_args(folder, tmp_path / 'a_file' / 'sub', '--epochs', '1'))
    assert code == 2 and 'cannot use output folder' in err and 'not a directory' in err, err


def _limited(limit_bytes):
    "A preexec_fn: files may not grow beyond `limit_bytes` (writes fail with EFBIG, as on a full or quota'd disk)."
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write beyond the limit fails instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply


def test_unwritable_output_is_refused_before_training(folder, tmp_path):
    out = tmp_path / 'run'
    t = time.perf_counter()
    p = warm_run([PY, '-m', 't2t_course.train', *train_args(folder, out, '--epochs', '5')], cwd=REPO, text=True,
                       capture_output=True, timeout=120, preexec_fn=_limited(0))
    assert p.returncode == 2 and f'cannot write into output folder {out}: file too large' in p.stderr, p.stderr
    assert 'epoch' not in p.stdout and time.perf_counter() - t < 60  # refused at the start, not after an epoch
    no_traceback(p.stderr)
    if os.geteuid() != 0:  # a read-only folder (root may write anywhere)
        ro = tmp_path / 'ro'; ro.mkdir(); ro.chmod(0o555)
        code, _, err = call(main, train_args(folder, ro, '--epochs', '1'))
        assert code == 2 and 'permission denied' in err, err


def test_a_full_disk_at_save_keeps_the_previous_checkpoint(folder, tmp_path):
    out = tmp_path / 'run'
    code, _, err = call(main, train_args(folder, out, '--epochs', '1'))
    assert code == 0, err
    before = (out / 'last.pth').read_bytes()
    p = warm_run([PY, '-m', 't2t_course.train', *train_args(folder, out, '--epochs', '2', '--resume', 'auto')], cwd=REPO,
                       text=True, capture_output=True, timeout=300, preexec_fn=_limited(20_000))
    assert p.returncode == 1, p.stderr
    assert f'file too large while saving {out / "last.pth"}; the previous checkpoint is intact' in p.stderr, p.stderr
    no_traceback(p.stderr)
    assert (out / 'last.pth').read_bytes() == before and not list(out.glob('.*.tmp'))
    assert torch.load(out / 'last.pth', weights_only=True)['epoch'] == 1


def test_no_space_left_names_the_cause(folder, tmp_path, monkeypatch):
    import errno
    import t2t_course.train.checkpoint as ckpt
    real_fsync = os.fsync
    def full(fd):  # the disk fills up while the first checkpoint is written
        if '.last.pth.' in os.readlink(f'/proc/self/fd/{fd}'): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)
    monkeypatch.setattr(ckpt.os, 'fsync', full)
    code, _, err = call(main, train_args(folder, tmp_path / 'run', '--epochs', '1'))
    assert code == 1 and 'no space left on device while saving' in err and 'no earlier checkpoint exists' in err, err
