"""Processes of this Python forked from a warm interpreter: `subprocess.Popen` without paying for `import torch` each time.

For the test suite only, which starts over a hundred command lines (`t2t_train`, `t2t_study`, `t2t_predict`, ...):
a command forked from an interpreter that has imported torch and the course's commands once costs about 0.3 CPU s
instead of 6. Appendix 26 explains how it works. The library never uses it: `run_study` starts its runs with
`subprocess.Popen` unless a caller passes another launcher (`run_study(..., popen=WarmPopen)`, as the tests do)."""
__all__ = ['PRELOAD', 'WarmPopen', 'warm_run']

import atexit, ctypes, gc, importlib, importlib.util, io, locale, os, pickle, runpy, signal, socket, struct, subprocess, sys, threading, types, warnings

import torch


PRELOAD = ['t2t_course.train.cli', 't2t_course.study.cli', 't2t_course.deploy.predict']   # what the warm interpreter imports, once
_PR_SET_CHILD_SUBREAPER = 36

def _parse(args) -> tuple:
    "`(-W options, kind, target, argv)` for a command line of this Python (`-m`, `-c` or a script), else None."
    if not args or os.fsdecode(args[0]) != sys.executable: return None
    rest, opts = [os.fsdecode(a) for a in args[1:]], []
    while len(rest) > 1 and rest[0] == '-W': opts.append(rest[1]); rest = rest[2:]
    if rest[:1] in (['-m'], ['-c']) and len(rest) > 1: return opts, rest[0], rest[1], rest[2:]
    if not rest or rest[0].startswith('-'): return None
    return opts, 'script', rest[0], rest[1:]

class _Warm:
    "This process's warm interpreter: started on first use; it exits when this process does (its socket closes)."
    sock = pid = libc = None
    lock = threading.Lock()

    @classmethod
    def ready(cls) -> bool:
        if os.environ.get('T2T_WARM', '1') == '0' or not sys.platform.startswith('linux'): return False
        if cls.pid != os.getpid():                                   # never started, or this is a forked copy
            try: open('/proc/self/mem', 'r+b').close()      # where a process may not write its own command line
            except OSError: return False                      # (see _retitle), `ps` would not see the command: plain start
            cls.libc = ctypes.CDLL(None, use_errno=True)
            ours, theirs = socket.socketpair()
            roots = [os.path.dirname(os.path.dirname(importlib.util.find_spec('t2t_course').origin)),  # importable anywhere
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]     # and tests.support
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([*roots, *filter(None, [os.environ.get('PYTHONPATH')])]),
                       T2T_WARM_TITLE_ROOM='.' * 4096)           # room for the commands' titles (see _retitle)
            subprocess.Popen([sys.executable, '-m', 'tests.support.warm', str(theirs.fileno()), *PRELOAD],
                             pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
            theirs.close()
            cls.sock, cls.pid = ours, os.getpid()
        return True

    @classmethod
    def spawn(cls, request:dict, fds:list) -> int:
        "Start one command in the warm interpreter; its pid, a child of this process."
        with cls.lock:
            if cls.libc.prctl(_PR_SET_CHILD_SUBREAPER, 1) != 0: raise OSError(ctypes.get_errno(), 'PR_SET_CHILD_SUBREAPER')
            try:
                data = pickle.dumps(request)
                socket.send_fds(cls.sock, [struct.pack('!I', len(data)) + data], fds)
                reply = cls.sock.recv(64)
            finally: cls.libc.prctl(_PR_SET_CHILD_SUBREAPER, 0)
        if not reply: raise RuntimeError('the warm interpreter is gone: run with T2T_WARM=0 to see the error')
        return int(reply)

class WarmPopen(subprocess.Popen):
    "`subprocess.Popen`, forked from the warm interpreter when the command is one of this Python's."
    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags,
                       shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *more):
        # more: restore_signals, gid, gids, uid, umask, start_new_session[, process_group (3.11+)]
        plain = len(more) > 5 and more[1:4] == (None, None, None) and more[4] < 0
        parsed = None if (shell or executable or preexec_fn or pass_fds or not plain) else _parse(list(args))
        if parsed is None or not _Warm.ready():
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                                          creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *more)
        opts, kind, target, argv = parsed
        env = dict(os.environ) if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
        group = more[6] if len(more) > 6 and more[6] is not None else -1
        request = dict(opts=opts, kind=kind, target=target, argv=argv, env=env, setsid=bool(more[5]), pgid=group,
                       cwd=os.path.abspath(os.fsdecode(cwd)) if cwd is not None else os.getcwd())
        try:                                           # the child's stdin, stdout, stderr: its pipes, or ours
            self.pid = _Warm.spawn(request, [fd if fd != -1 else std for std, fd in enumerate((p2cread, c2pwrite, errwrite))])
            self._child_created = True
        finally:                                       # as subprocess does: the child's ends of the pipes close here
            devnull = getattr(self, '_devnull', None)
            for fd, other in ((p2cread, p2cwrite), (c2pwrite, c2pread), (errwrite, errread)):
                if fd != -1 and other != -1 and fd != devnull: os.close(fd)
            if devnull is not None: os.close(devnull)
            self._closed_child_pipe_fds = True

def warm_run(*popenargs, input=None, capture_output=False, timeout=None, check=False, **kwargs) -> subprocess.CompletedProcess:
    "`subprocess.run` through `WarmPopen`."
    if input is not None: kwargs['stdin'] = subprocess.PIPE
    if capture_output: kwargs['stdout'] = kwargs['stderr'] = subprocess.PIPE
    with WarmPopen(*popenargs, **kwargs) as p:
        try: out, err = p.communicate(input, timeout=timeout)
        except BaseException: p.kill(); p.wait(); raise
        if check and p.returncode: raise subprocess.CalledProcessError(p.returncode, p.args, output=out, stderr=err)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)

def _serve(sock):
    "In the warm interpreter: answer requests until the caller goes away; in each command's process, return its request."
    while True:
        try: msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        except OSError: os._exit(0)
        if not msg: os._exit(0)                              # the caller exited
        (n,), data = struct.unpack('!I', msg[:4]), msg[4:]
        while len(data) < n: data += sock.recv(n - len(data))
        pid_r, pid_w = os.pipe()
        go_r, go_w = os.pipe()                               # closed once the command is the caller's child
        middle = os.fork()
        if middle == 0:                                      # the middle process: fork the command and exit at once
            pid = os.fork()
            if pid == 0:
                for fd in (pid_r, pid_w, go_w): os.close(fd)
                os.read(go_r, 1); os.close(go_r)             # wait for the hand-over (EOF)
                sock.close()
                return pickle.loads(data), fds
            os.write(pid_w, str(pid).encode())
            os._exit(0)
        os.close(pid_w); os.close(go_r)
        pid = os.read(pid_r, 64); os.close(pid_r)
        os.waitpid(middle, 0)                                # reaped: its child now belongs to the caller
        os.close(go_w)
        sock.sendall(pid)
        for fd in fds: os.close(fd)

def _retitle(args:list):
    """Show `args` as this process's command line (`ps`, `pgrep -f`): written over the argv and environment strings the
    warm interpreter started with, which nothing points to once `os.environ` has been replaced (as `setproctitle` does)."""
    try:
        with open('/proc/self/stat', 'rb') as f: stat = f.read().rsplit(b')', 1)[1].split()
        start, end, env_end = int(stat[45]), int(stat[46]), int(stat[48])   # fields 48, 49 and 51 of proc(5)
        title = b'\0'.join(map(os.fsencode, args)) + b'\0'
        if len(title) <= end - start: title = title.ljust(end - start, b'\0')
        else: title = title.replace(b'\0', b' ')[:env_end - start - 1] + b'\0'   # one string, read up to its NUL
        with open('/proc/self/mem', 'r+b', buffering=0) as m: m.seek(start); m.write(title)
    except (OSError, ValueError, IndexError): pass           # no /proc: the warm interpreter's command line stays

def _become(request:dict, fds:list, base_path:list):
    "Turn this forked process into `python OPTS (-m MOD | -c CODE | SCRIPT) ARGV` as a fresh interpreter starts it."
    if request['setsid']: os.setsid()
    elif request['pgid'] != -1: os.setpgid(0, request['pgid'])
    for std, fd in enumerate(fds): os.dup2(fd, std); os.close(fd)
    os.chdir(request['cwd'])
    env = request['env']; os.environ.clear(); os.environ.update(env)
    kind, target, opts = request['kind'], request['target'], [x for o in request['opts'] for x in ('-W', o)]
    _retitle([sys.executable, *opts, *([kind] if kind != 'script' else []), target, *request['argv']])
    enc, _, errors = env.get('PYTHONIOENCODING', '').partition(':')
    enc, unbuffered = enc or locale.getpreferredencoding(False), bool(env.get('PYTHONUNBUFFERED'))
    def stream(fd, mode, errs, line):
        raw = open(fd, mode + 'b', buffering=0 if unbuffered and mode == 'w' else -1, closefd=False)
        return io.TextIOWrapper(raw, encoding=enc, errors=errs, line_buffering=line, write_through=unbuffered and mode == 'w')
    sys.stdin = sys.__stdin__ = stream(0, 'r', errors or 'strict', False)
    sys.stdout = sys.__stdout__ = stream(1, 'w', errors or 'strict', os.isatty(1))
    sys.stderr = sys.__stderr__ = stream(2, 'w', 'backslashreplace', True)
    sys.warnoptions[:] = [o for o in env.get('PYTHONWARNINGS', '').split(',') if o] + request['opts']
    warnings._processoptions(sys.warnoptions)                 # on top of the default filters and the imports' own
    if env.get('OMP_NUM_THREADS', '').isdigit(): torch.set_num_threads(int(env['OMP_NUM_THREADS']))
    first = {'-c': '', '-m': os.getcwd(), 'script': os.path.dirname(os.path.abspath(target))}[kind]
    sys.path[:] = [first, *[p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p], *base_path]
    sys.modules['__main__'] = main = types.ModuleType('__main__')
    if kind == '-c':
        sys.argv = ['-c', *request['argv']]
        exec(compile(target, '<string>', 'exec'), main.__dict__)
    elif kind == '-m':
        sys.argv = ['-m', *request['argv']]
        sys.modules.pop(target, None)                         # run afresh as __main__, as `python -m` does
        runpy._run_module_as_main(target)
    else:
        sys.argv = [target, *request['argv']]
        runpy.run_path(target, run_name='__main__')

def _exit(code:int):
    "End the command as the interpreter ends, without tearing down the modules imported before the fork (1.4 CPU s here)."
    atexit._run_exitfuncs()
    for f in gc.get_objects():                               # files the command left open: flushed, as at finalisation
        if isinstance(f, io.IOBase) and f not in (sys.stdout, sys.stderr):   # (the frozen imports' objects are not listed)
            try: f.closed or f.flush()
            except Exception: pass
    try: sys.stdout.flush()
    except Exception as e:                                   # python: the same message, exit status 120
        print(f"Exception ignored in: {sys.stdout!r}\n{type(e).__name__}: {e}", file=sys.stderr); code = 120
    try: sys.stderr.flush()
    except Exception: pass
    os._exit(code)

def _warm_main(argv:list):
    "`python -m tests.support.warm FD MODULE...`: import the modules, then serve the caller on socket FD."
    sock = socket.socket(fileno=int(argv[0]))
    extra = [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in extra]   # what a fresh interpreter has after its PYTHONPATH
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for name in argv[1:]: importlib.import_module(name)
    gc.freeze()                                              # the collector leaves the imports' objects (shared pages) alone
    sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)    # a Ctrl-C for the caller's process group is not for us
    request, fds = _serve(sock)
    signal.signal(signal.SIGINT, sigint)                     # the command gets what a fresh interpreter would
    try: _become(request, fds, base_path)
    except SystemExit as e:                                  # sys.exit(None | int | message), as python reads it
        if e.code is None or isinstance(e.code, int): _exit(e.code or 0)
        print(e.code, file=sys.stderr); _exit(1)
    except BaseException as e:                               # report it as `python` does: from the command's frames
        tb, ours = e.__traceback__, lambda f: f == __file__ or (request['kind'] == 'script' and 'runpy' in f)
        while tb is not None and ours(tb.tb_frame.f_code.co_filename): tb = tb.tb_next   # (-m: from runpy's, as python)
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        if not isinstance(e, KeyboardInterrupt): _exit(1)
        atexit._run_exitfuncs(); sys.stdout.flush(); sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGINT)   # an uncaught Ctrl-C
    _exit(0)

if __name__ == '__main__': _warm_main(sys.argv[1:])