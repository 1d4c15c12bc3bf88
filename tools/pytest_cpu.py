"""CPU seconds per test, the test's own and its subprocesses', for profiling the suite on a busy or shared machine.

Wall-clock durations (`pytest --durations=30`) change with whatever else runs on the cores; CPU seconds barely do.
As a pytest plugin it appends one JSON line per test (setup, call and teardown together) to `$PYTEST_CPU_OUT`
(default `pytest_cpu.jsonl`); it works under pytest-xdist, each worker appending its own lines:

    PYTHONPATH=tools python -m pytest -q -n 2 -p pytest_cpu tests
    python tools/pytest_cpu.py pytest_cpu.jsonl        # CPU seconds per test file, then the 40 costliest tests

`children` counts only subprocesses the test waited for (subprocess.run, Popen.wait), which is how the tests start
theirs."""
import json, os, resource, sys, time
from collections import defaultdict


def _cpu():
    "(this process's CPU seconds, its waited-for children's)."
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


_spawned = [0]   # processes this test process started (subprocess.Popen), counted for the summary


def _count_spawns():
    import subprocess
    init = subprocess.Popen.__init__
    def counting_init(self, *a, **k):
        _spawned[0] += 1
        init(self, *a, **k)
    subprocess.Popen.__init__ = counting_init


try:
    import pytest
    _count_spawns()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        w0, (s0, c0), n0 = time.perf_counter(), _cpu(), _spawned[0]
        yield
        (s1, c1), wall = _cpu(), time.perf_counter() - w0
        with open(os.environ.get('PYTEST_CPU_OUT', 'pytest_cpu.jsonl'), 'a') as f:
            f.write(json.dumps(dict(id=item.nodeid, wall=round(wall, 3), self=round(s1 - s0, 3),
                                    children=round(c1 - c0, 3), spawned=_spawned[0] - n0)) + '\n')
except ImportError: pass


def summary(path, top=40):
    "Print CPU seconds per test file and the `top` costliest tests of a `pytest_cpu` JSON-lines file."
    rows = [json.loads(line) for line in open(path) if line.strip()]
    for r in rows: r['cpu'] = r['self'] + r['children']
    print(f"{len(rows)} tests: {sum(r['cpu'] for r in rows):.0f} CPU s ({sum(r['self'] for r in rows):.0f} in the test "
          f"processes, {sum(r['children'] for r in rows):.0f} in the {sum(r.get('spawned', 0) for r in rows)} "
          f"subprocesses they started)")
    files = defaultdict(float)
    for r in rows: files[r['id'].split('::')[0]] += r['cpu']
    for f, cpu in sorted(files.items(), key=lambda kv: -kv[1]): print(f"{cpu:8.1f}  {f}")
    print()
    for r in sorted(rows, key=lambda r: -r['cpu'])[:top]:
        print(f"{r['cpu']:8.1f}  (self {r['self']:6.1f}, {r.get('spawned', 0):2d} subprocesses {r['children']:6.1f})  {r['id']}")


if __name__ == '__main__':
    if len(sys.argv) not in (2, 3): sys.exit("usage: python tools/pytest_cpu.py PYTEST_CPU_JSONL [TOP]")
    summary(sys.argv[1], *(int(a) for a in sys.argv[2:]))
