"""The shape of the library: modules of one concept (at most 450 lines each), imports that point one way, and the
training code asking the pipeline registry instead of naming pipelines. Static checks of the source: no import."""
import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / 't2t_course'
MODULES = {p.stem: p for p in sorted(LIB.glob('*.py')) if p.name not in ('_modidx.py', '__init__.py')}
MAX_LINES = 450


def _imports(path: Path) -> set:
    "The t2t_course modules `path` imports, anywhere in it (module level, functions, `if __name__ == '__main__'`)."
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module: found.add(node.module.split('.')[0])
            elif node.level == 0 and (node.module or '').startswith('t2t_course.'): found.add(node.module.split('.')[1])
            elif node.level == 1 and node.module is None: found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split('.')[1] for a in node.names if a.name.startswith('t2t_course.'))
    return found & set(MODULES)


def test_modules_are_small():
    long = {name: n for name, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_import_cycle():
    graph = {name: _imports(p) - {name} for name, p in MODULES.items()}
    state = {}  # name -> 'open' while on the path, 'done' after

    def visit(name, path):
        state[name] = 'open'
        for dep in sorted(graph[name]):
            if state.get(dep) == 'open': pytest.fail(f"import cycle: {' -> '.join(path[path.index(dep):] + [dep])}")
            if dep not in state: visit(dep, path + [dep])
        state[name] = 'done'

    for name in graph:
        if name not in state: visit(name, [name])


def test_cycle_check_can_fail(tmp_path, monkeypatch):
    "The cycle check on two modules that import each other."
    (tmp_path / 'a.py').write_text('from .b import x\n'); (tmp_path / 'b.py').write_text('def f():\n    from .a import y\n')
    monkeypatch.setattr(__import__(__name__), 'MODULES', {'a': tmp_path / 'a.py', 'b': tmp_path / 'b.py'})
    with pytest.raises(pytest.fail.Exception, match='import cycle: a -> b -> a'): test_no_import_cycle()


@pytest.mark.parametrize('module', ['config', 'run', 'loop', 'train'])
def test_training_names_no_pipeline(module):
    "The training code and its config ask the registry (chapter 12) what a pipeline needs; no pipeline's name is in them."
    from t2t_course.data.pipelines import PIPELINES
    names = {n.value for n in ast.walk(ast.parse(MODULES[module].read_text()))
             if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not names & set(PIPELINES), f"{module}.py names pipelines {sorted(names & set(PIPELINES))}"


def test_no_private_names_across_modules():
    "A module imports only public names of another (a name another module needs is part of its API)."
    private = []
    for name, p in MODULES.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or '').startswith('t2t_course')):
                private += [f"{name}: {node.module}.{a.name}" for a in node.names if a.name.startswith('_')]
    assert not private, f"private names imported across modules: {private}"
