"""The commands alike (t2t_train, t2t_eval, t2t_predict, t2t_convert and t2t_study, their path arguments) on paths the OS refuses: a
name too long, or a folder under a regular file, is one line naming the path and the reason, exit 2, no traceback."""
import pytest

from tests.support.commands import call
from t2t_course.deploy import predict_main

LONG = 'x' * 300  # one path component over the 255 bytes file systems allow


@pytest.mark.parametrize('command', ['t2t_train --output', 't2t_train --data', 't2t_train --resume', 't2t_eval',
                                     't2t_eval --data', 't2t_predict image', 't2t_predict --onnx', 't2t_convert SRC',
                                     't2t_convert DST', 't2t_convert DST under a file', 't2t_study --output',
                                     't2t_study --data', 't2t_train --output under a file'])
def test_paths_the_os_refuses(command, tmp_path, trained):
    "A name too long, or a folder under a regular file: one line naming the path and the reason, exit 2, no traceback."
    from t2t_course.train.cli import eval_main, main
    from t2t_course.study import study_main
    from t2t_course.deploy.convert import convert_main
    long = str(tmp_path / LONG)
    (tmp_path / 'afile').write_text('')
    fn, argv = {
        't2t_train --output': (main, ['--epochs', '1', '--output', long]),
        't2t_train --data': (main, ['--data', long]),
        't2t_train --resume': (main, ['--resume', long + '.pth']),
        't2t_eval': (eval_main, [long + '.pth']),
        't2t_eval --data': (eval_main, [str(trained), '--data', long]),
        't2t_predict image': (predict_main, [long + '.png', '--checkpoint', str(trained), '--device', 'cpu']),
        't2t_predict --onnx': (predict_main, [str(tmp_path / 'afile'), '--onnx', long + '.onnx']),
        't2t_convert SRC': (convert_main, [long + '.pth', str(tmp_path / 'out')]),
        't2t_convert DST': (convert_main, [str(trained), long]),
        't2t_convert DST under a file': (convert_main, [str(trained), str(tmp_path / 'afile' / 'out')]),
        't2t_study --output': (study_main, ['--quick', '--output', long]),
        't2t_study --data': (study_main, ['--quick', '--data', long, '--output', str(tmp_path / 'study')]),
        't2t_train --output under a file': (main, ['--epochs', '1', '--output', str(tmp_path / 'afile' / 'run')]),
    }[command]
    code, out, err = call(fn, argv)
    last = err.strip().splitlines()[-1]  # argparse's usage line may come first, for a bad flag
    assert code == 2 and 'Traceback' not in err and last.split(': ')[1] == 'error', err
    assert ('too long' in last or 'not a directory' in last) and ('x' * 50 in last or 'afile' in last), err


# ------------------------------------------------------------------ Ctrl-C while a command starts
@pytest.mark.parametrize('command', ['t2t_train', 't2t_eval', 't2t_predict', 't2t_study', 't2t_prepare_val', 't2t_convert'])
def test_ctrl_c_while_a_command_starts_is_one_line(command):
    "Ctrl-C during the imports (torch's two seconds, before the command's own handling exists): one line, exit 130."
    import os, signal, subprocess, sys, time
    from pathlib import Path
    from t2t_commands import COMMANDS
    script = Path(sys.executable).with_name(command)
    assert set(COMMANDS) == {'t2t_train', 't2t_eval', 't2t_study', 't2t_predict', 't2t_prepare_val', 't2t_convert'}
    if not script.exists(): pytest.skip(f'{script} is not installed (pip install -e .)')
    # Wait until torch is being loaded (its shared library in the process's maps): t2t_commands has installed its handler
    # by then. (Before, in the interpreter's own start-up, Python's default applies: a fraction of a second.)
    p = subprocess.Popen([str(script), '--help'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONWARNINGS='ignore'))
    maps, deadline = Path(f'/proc/{p.pid}/maps'), time.time() + 60
    if not maps.parent.exists(): pytest.skip('no /proc: cannot see when the library starts loading')
    while p.poll() is None and time.time() < deadline:
        try:
            if 'libtorch' in maps.read_text(): break
        except OSError: break
        time.sleep(0.005)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    if p.returncode == 0: pytest.skip('the command had already started (a very fast start): nothing to interrupt')
    assert p.returncode == 130 and err.strip() == f'{command}: interrupted (Ctrl-C) while starting; nothing was done', err
