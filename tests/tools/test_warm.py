"""`tests/support/warm.py`: a command forked from the warm interpreter behaves as the same command started fresh.

The commands here import nothing heavy, so the fresh interpreter they are compared with starts in a few hundredths of a
second; chapter 20 compares a real `t2t_train` error both ways."""
import os, signal, subprocess, sys, time

import pytest

from tests.support.warm import WarmPopen, warm_run

PY = sys.executable
pytestmark = pytest.mark.skipif(not sys.platform.startswith('linux'), reason='the warm start needs Linux (subreaper)')


def both(args, **kw):
    "(warm, fresh) CompletedProcess of the same command line of this Python."
    kw = dict(capture_output=True, text=True, timeout=60) | kw
    return warm_run([PY, *args], **kw), subprocess.run([PY, *args], **kw)


def same(a, b): return (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


@pytest.mark.parametrize('code', ['import sys; print("out"); sys.exit(3)', 'import sys; sys.exit("a message")',
                                  'raise ValueError("bad")', 'def f(): 1/0\nf()', 'raise KeyboardInterrupt',
                                  'import sys; print(sys.argv, sys.path[0] == "")'])
def test_exit_status_and_output_as_python(code):
    warm, fresh = both(['-c', code, 'arg 1', '--flag'])
    assert same(warm, fresh), (warm, fresh)


def test_warning_options_encoding_and_paths_as_python(tmp_path):
    (tmp_path / 'pkg').mkdir(); (tmp_path / 'pkg' / '__init__.py').write_text('')
    (tmp_path / 'pkg' / 'tool.py').write_text('import sys, warnings\nprint(sys.argv[1:], __name__, sys.path[0])\n'
                                              'print("caf\\u00e9")\nwarnings.warn("careful")\n')
    (tmp_path / 'script.py').write_text('import sys\nprint(sys.argv, sys.path[0], __file__)\n')
    env = dict(os.environ, PYTHONIOENCODING='latin-1', PYTHONPATH=str(tmp_path))
    for args, extra in [(['-m', 'pkg.tool', 'x'], {}), (['-W', 'error', '-m', 'pkg.tool'], {}),
                        ([str(tmp_path / 'script.py'), 'y'], {}), (['-c', 'import warnings; warnings.warn("w")'],
                                                                   dict(env=dict(env, PYTHONWARNINGS='ignore')))]:
        warm, fresh = both(args, cwd=tmp_path, text=False, **(dict(env=env) | extra))   # bytes: the encoding is checked
        assert same(warm, fresh), (args, warm, fresh)


def test_stdin_environment_and_folder():
    code = 'import os, sys; print(sys.stdin.read().upper(), os.environ["ONLY"], "HOME" in os.environ, os.getcwd())'
    warm, fresh = both(['-c', code], input='piped', env={'ONLY': 'this'}, cwd='/tmp')
    assert same(warm, fresh) and warm.stdout == 'PIPED this False /tmp\n'


def test_a_child_of_the_caller_with_its_command_line_and_session():
    p = WarmPopen([PY, '-c', 'import os, sys, time; print(os.getppid(), os.getpgid(0)); sys.stdout.flush(); time.sleep(60)',
                   'marker-of-this-test'], stdout=subprocess.PIPE, text=True, start_new_session=True)
    ppid, pgid = map(int, p.stdout.readline().split())
    assert ppid == os.getpid() and pgid == p.pid                      # the caller's own child, in a session of its own
    assert b'marker-of-this-test' in open(f'/proc/{p.pid}/cmdline', 'rb').read()    # ps and pgrep -f see the command
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == -signal.SIGTERM


def test_a_file_left_open_is_written_and_the_preload_is_there(tmp_path):
    f = tmp_path / 'left_open.txt'
    r = warm_run([PY, '-c', f'import sys; f = open({str(f)!r}, "w"); f.write("kept"); print("torch" in sys.modules)'],
                 capture_output=True, text=True)
    assert r.returncode == 0 and f.read_text() == 'kept'
    assert r.stdout == 'True\n'                                       # forked warm: torch came with the fork


def test_other_commands_and_t2t_warm_0_start_fresh(monkeypatch):
    assert warm_run(['echo', 'hi'], capture_output=True, text=True).stdout == 'hi\n'
    code = ['-c', 'import sys; print("torch" in sys.modules)']
    assert warm_run([PY, '-I', *code], capture_output=True, text=True).stdout == 'False\n'   # an option we do not fork
    monkeypatch.setenv('T2T_WARM', '0')
    assert warm_run([PY, *code], capture_output=True, text=True).stdout == 'False\n'


def test_a_timeout_kills_the_command():
    t = time.time()
    with pytest.raises(subprocess.TimeoutExpired):
        warm_run([PY, '-c', 'import time; time.sleep(60)'], timeout=1)
    assert time.time() - t < 30
