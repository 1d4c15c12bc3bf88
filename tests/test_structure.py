"""The shape of the library: one package per part of the course, each module generated from the one notebook whose
`#| default_exp` it is, modules of one concept (at most 450 lines each) built from exported cells of at most 100 lines,
imports that point one way (the layer rule), package faces that gather their modules' names, and the training code
asking the pipeline registry instead of naming pipelines. Static checks of the source and the notebooks, and a few
imports."""
import ast, json, re, shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIB = REPO / 't2t_course'
NBS = REPO / 'nbs'
GLUE = ('__init__.py', '__main__.py')   # written by hand: imports only
MAX_LINES = 450
MAX_CELL_LINES = 100     # an exported cell's lines, its `#|` directives included
PARTS = ('models', 'data', 'train', 'study', 'deploy')
TOP = {'core', 'minimal', 'timm'}       # the only modules beside the parts' packages


def modules(lib: Path = LIB) -> dict:
    "{'models.backbone': path, 'core': path, ...}: every generated module under `lib`, walking subfolders."
    return {'.'.join(p.relative_to(lib).with_suffix('').parts): p for p in sorted(lib.rglob('*.py'))
            if p.name not in GLUE and p.name != '_modidx.py' and '__pycache__' not in p.parts}


def glue_files(lib: Path = LIB) -> list:
    return sorted(p for name in GLUE for p in lib.rglob(name) if '__pycache__' not in p.parts)


def _absolute(name: str, path: Path, lib: Path, node: ast.ImportFrom) -> str:
    "The dotted name (below t2t_course) an import of `path` refers to; '' for an import from outside the package."
    if node.level == 0:
        mod = node.module or ''
        return mod.split('.', 1)[1] if mod.startswith('t2t_course.') else ('' if mod != 't2t_course' else '.')
    pkg = list(path.relative_to(lib).parent.parts)
    base = pkg[:len(pkg) - (node.level - 1)] if node.level > 1 else pkg
    return '.'.join(base + ([node.module] if node.module else [])) or '.'


def imports(path: Path, lib: Path = LIB, known=None) -> set:
    """The modules of the package `path` imports, anywhere in it (module level, functions, `if __name__ == ...`),
    resolved to generated modules: `from ..models import backbone` and `from t2t_course.models.backbone import x`
    both give 'models.backbone'; an import of a package gives the package's name ('models')."""
    known = modules(lib) if known is None else known
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = _absolute('', path, lib, node)
            if not target: continue
            target = '' if target == '.' else target
            for a in node.names:   # `from package import module` names a module
                sub = f'{target}.{a.name}' if target else a.name
                found.add(sub if sub in known else (target or '.'))
        elif isinstance(node, ast.Import):
            found.update(a.name.split('.', 1)[1] for a in node.names if a.name.startswith('t2t_course.'))
    return {f for f in found if f and f != '.'}


def part(name: str) -> str:
    "'models' for 'models.backbone', 'data' for 'data.pipelines.fast', 'core' for 'core'."
    return name.split('.')[0]


# ---------------------------------------------------------------------------------------------- the layout
def test_one_package_per_part():
    flat = {n for n in modules() if '.' not in n}
    assert flat <= TOP, f"modules outside the parts' packages: {sorted(flat - TOP)}"
    assert {part(n) for n in modules()} == TOP | set(PARTS)
    for p in PARTS: assert (LIB / p / '__init__.py').is_file(), p


def notebook_exports() -> dict:
    "{notebook path: (its `#| default_exp`, [modules named by `#| export <module>` cells])}."
    out = {}
    for nb in sorted(NBS.rglob('*.ipynb')):
        if '.ipynb_checkpoints' in nb.parts: continue
        default, others = None, []
        for c in json.loads(nb.read_text())['cells']:
            if c['cell_type'] != 'code': continue
            src = ''.join(c['source'])
            if m := re.search(r'^#\|\s*default_exp[ \t]+(\S+)', src, re.M): default = m[1]
            others += re.findall(r'^#\|\s*export[si]?[ \t]+(\S+)[ \t]*$', src, re.M)
        out[nb] = (default, others)
    return out


def test_each_module_comes_from_the_notebook_its_header_names():
    "Every generated module's header names a notebook whose `#| default_exp` is that module; no notebook exports into another's."
    exports = notebook_exports()
    crossing = {str(nb.relative_to(REPO)): others for nb, (_, others) in exports.items() if others}
    assert not crossing, f"`#| export <module>` cells (each module is exported by its own notebook only): {crossing}"
    declared = {d: nb for nb, (d, _) in exports.items() if d}
    wrong = {}
    for name, p in modules().items():
        m = re.search(r'File to edit: (\S+?)\.?$', p.read_text(), re.M)
        if not m: wrong[name] = 'no "File to edit" header'; continue
        nb = (p.parent / m[1]).resolve()
        if declared.get(name) != nb: wrong[name] = f"header names {m[1]}, declared by {declared.get(name)}"
    assert not wrong, wrong
    stale = sorted(set(modules()) - set(declared))
    assert not stale, f"generated files that no notebook declares (delete them): {stale}"
    missing = sorted(set(declared) - set(modules()) - {'__init__'})
    assert not missing, f"declared modules with no generated file (run nbdev_export): {missing}"


def test_package_glue_holds_only_imports():
    "`__init__.py` and `__main__.py` are written by hand: imports, the lazy names, a version, a call to a command."
    for p in glue_files():
        for node in ast.parse(p.read_text()).body:
            ok = isinstance(node, (ast.Import, ast.ImportFrom, ast.Expr)) or (
                 isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) in ('__version__', '(__getattr__, __dir__)'))
            assert ok, f"{p.relative_to(REPO)}:{node.lineno}: only imports belong here, got {ast.unparse(node)[:80]}"


def test_modules_are_small():
    long = {name: n for name, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def long_export_cells(nbs: Path = NBS, limit: int = MAX_CELL_LINES) -> list:
    """Every `#| export` cell (also `exports`, `exporti`) of the notebooks under `nbs` longer than `limit` lines, as
    'notebook, cell id, first line, line count': a cell of one idea reads on a screen, with prose between the ideas."""
    long = []
    for nb in sorted(nbs.rglob('*.ipynb')):
        if '.ipynb_checkpoints' in nb.parts: continue
        for c in json.loads(nb.read_text())['cells']:
            lines = ''.join(c['source']).splitlines()
            if c['cell_type'] != 'code' or not any(re.match(r'#\|\s*export[si]?\s*$', l) for l in lines): continue
            if len(lines) > limit:
                first = next((l for l in lines if l.strip() and not l.startswith('#|')), '')
                long.append(f"{nb.relative_to(nbs)}, cell {c.get('id')}, {first.strip()!r}: {len(lines)} lines")
    return long


def test_exported_cells_are_short():
    assert not long_export_cells(), f"exported cells over {MAX_CELL_LINES} lines (split them): {long_export_cells()}"


def test_cell_length_check_can_fail(tmp_path):
    "The check on a notebook with an exported cell one line too long, one at the limit and a long cell not exported."
    body = lambda n: ['#| export\n', 'def f():\n'] + ['    x = 1\n'] * (n - 2)
    cells = [{'cell_type': 'code', 'id': 'a1b2c3d4', 'source': body(MAX_CELL_LINES + 1)},
             {'cell_type': 'code', 'id': 'e5f60718', 'source': body(MAX_CELL_LINES)},
             {'cell_type': 'code', 'id': '293a4b5c', 'source': body(MAX_CELL_LINES + 50)[1:]},
             {'cell_type': 'markdown', 'id': '6d7e8f90', 'source': ['#| export\n'] * (MAX_CELL_LINES + 1)}]
    (tmp_path / '99_long.ipynb').write_text(json.dumps({'cells': cells}))
    assert long_export_cells(tmp_path) == [f"99_long.ipynb, cell a1b2c3d4, 'def f():': {MAX_CELL_LINES + 1} lines"]


# ---------------------------------------------------------------------------------------------- the layer rule
def layer_violations(lib: Path = LIB) -> list:
    """What breaks the layer rule: `core` imports nothing of the package; `models` and `data` never import `train`,
    `study` or `deploy`; nothing imports `minimal`, and `minimal` imports nothing of the package."""
    known, bad = modules(lib), []
    files = {**known, **{'.'.join(p.relative_to(lib).with_suffix('').parts): p for p in glue_files(lib)}}
    for name, p in files.items():
        deps = imports(p, lib, known) - {name}
        deps_parts = {part(d) for d in deps}
        if name == 'core' and deps: bad.append(f"core imports {sorted(deps)}")
        if name == 'minimal' and deps: bad.append(f"minimal imports {sorted(deps)}")
        if 'minimal' in deps_parts and name != 'minimal': bad.append(f"{name} imports minimal")
        if part(name) in ('models', 'data'):
            up = sorted(d for d in deps if part(d) in ('train', 'study', 'deploy'))
            if up: bad.append(f"{name} imports {up}")
    return bad


def import_cycle(lib: Path = LIB) -> list:
    "An import cycle among the generated modules (a list of names, first == last), or []."
    known = modules(lib)
    graph = {name: {d for d in imports(p, lib, known) if d in known} - {name} for name, p in known.items()}
    state = {}

    def visit(name, path):
        state[name] = 'open'
        for dep in sorted(graph[name]):
            if state.get(dep) == 'open': return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep, path + [dep])): return found
        state[name] = 'done'
        return []

    for name in graph:
        if name not in state and (found := visit(name, [name])): return found
    return []


def test_layer_rule():
    assert not layer_violations(), layer_violations()


def test_no_import_cycle():
    assert not import_cycle(), ' -> '.join(import_cycle())


@pytest.mark.parametrize('plant, expect', [
    (('models/backbone.py', 'from ..train.optim import create_optimizer\n'), "models.backbone imports ['train.optim']"),
    (('data/pipelines/fast.py', 'def f():\n    from t2t_course.study import runner\n'), "data.pipelines.fast imports ['study.runner']"),
    (('core.py', 'from .models import backbone\n'), "core imports ['models.backbone']"),
    (('train/loop.py', 'from .. import minimal\n'), 'train.loop imports minimal'),
    (('minimal.py', 'from t2t_course.core import to_2tuple\n'), "minimal imports ['core']"),
])
def test_layer_rule_can_fail(tmp_path, plant, expect):
    "The rule on a copy of the package with one forbidden import planted (at module level or inside a function)."
    lib = tmp_path / 't2t_course'
    shutil.copytree(LIB, lib, ignore=shutil.ignore_patterns('__pycache__'))
    file, line = plant
    (lib / file).write_text((lib / file).read_text() + '\n' + line)
    assert expect in layer_violations(lib)


def test_cycle_check_can_fail(tmp_path):
    "The cycle check on a copy of the package where the T2T layer imports the model that imports it."
    lib = tmp_path / 't2t_course'
    shutil.copytree(LIB, lib, ignore=shutil.ignore_patterns('__pycache__'))
    (lib / 'models' / 't2t_layer.py').write_text((lib / 'models' / 't2t_layer.py').read_text()
                                                 + '\ndef f():\n    from .t2t_vit import T2TViT\n')
    cycle = import_cycle(lib)
    assert cycle[0] == cycle[-1] and {'models.t2t_layer', 'models.t2t_vit'} <= set(cycle), cycle


def test_no_private_names_across_modules():
    "A module imports only public names of another (a name another module needs is part of its API)."
    private = []
    for name, p in modules().items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or '').startswith('t2t_course')):
                private += [f"{name}: {node.module}.{a.name}" for a in node.names if a.name.startswith('_')]
    assert not private, f"private names imported across modules: {private}"


# ---------------------------------------------------------------------------------------------- the faces
@pytest.mark.parametrize('package', ['t2t_course.models', 't2t_course.data', 't2t_course.data.pipelines', 't2t_course.train',
                                     't2t_course.study', 't2t_course.deploy'])
def test_a_package_gathers_its_modules_names(package):
    """`from t2t_course.<part> import name` gives the object its module defines, for every public name of the part's
    modules; a name that is also a module's name (`t2t_course.train.evaluate`) is the module, as Python's imports have it."""
    import importlib, pkgutil
    pkg = importlib.import_module(package)
    subs = [m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith('_')]
    first = {}
    for m in subs:
        mod = importlib.import_module(f'{package}.{m}')
        for n in getattr(mod, '__all__', ()): first.setdefault(n, mod)
    for n, mod in first.items():
        assert getattr(pkg, n) is (importlib.import_module(f'{package}.{n}') if n in subs else getattr(mod, n)), n
    assert set(first) | set(subs) <= set(dir(pkg))
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'no_such_name'"): pkg.no_such_name


@pytest.mark.parametrize('module', ['train/config.py', 'train/run.py', 'train/loop.py'])
def test_training_names_no_pipeline(module):
    "The training code and its config ask the registry (chapter 12e) what a pipeline needs; no pipeline's name is in them."
    from t2t_course.data.pipelines.registry import PIPELINES
    names = {n.value for n in ast.walk(ast.parse((LIB / module).read_text()))
             if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not names & set(PIPELINES), f"{module} names pipelines {sorted(names & set(PIPELINES))}"
