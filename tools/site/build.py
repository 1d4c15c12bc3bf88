"""Build the course's website (`_site/`) from `nbs/*.ipynb` and their committed outputs, without running them.

Called by `tools/site.sh`, which installs the tools first (settings.ini's `docs_requirements`: Jupyter Book 1, that
is Sphinx + MyST-NB with the book theme); MathJax 3 comes from the npm registry's `mathjax` package, fetched once
with `npm pack` into `_site_build/cache/`.

What it does, in a scratch folder (`_site_build/`, ignored by git):
1. finds the chapters in `nbs/` and sorts them into the course's parts (`PARTS` below: the one place where the
   parts are listed; the sidebar of this site and `nbs/sidebar.yml` for Quarto are both made from it), and the
   guides in `nbs/guides/*.md` (Markdown pages, in the order `GUIDES` gives, in a part of their own);
2. copies each notebook into `_site_build/src/`, turning nbdev's `#|` directives into what MyST-NB reads
   (`#| hide` cells left out, directive lines taken off the code shown), "chapter 07" in prose into a link to
   that chapter, putting the chapter number on the page title, a "download / open in Colab" line under the title
   and an anchor before each cell that defines a name of the library;
3. writes `names.md`, the index of the library's public names (from `t2t_course/_modidx.py`, each name linked to
   the cell of the chapter that defines it), `_toc.yml` and `_config.yml`;
4. runs Jupyter Book's Sphinx build (notebook execution off), then copies MathJax (its SVG output: no web fonts,
   so pages work from file:// too) and the original notebooks into the output and moves it to `_site/`.

Usage: python tools/site/build.py [--out _site] [--only 00_overview,05_performer] [--jobs N] [--fresh] [--sidebar-only]
"""
import argparse, ast, configparser, html, json, os, re, shutil, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NBS = ROOT / 'nbs'
LIB = ROOT / 't2t_course'
HERE = Path(__file__).resolve().parent
HOME = '00_overview'  # the home page of the site

# The course's parts, in order: a caption and the chapter numbers it holds. A notebook `NN<x>_name.ipynb` goes to
# the part that lists NN; within a part, notebooks go by file name.
# A chapter that is not written yet is simply absent from nbs/ and from the site.
PARTS = [
    ('Part I, the model', '00 01 02 03 04 05 06 07 08 09 10'),
    ('Part II, training at scale', '11 12 13 14 15 16 17 18 19'),
    ('Part III, evidence', '20 21'),
    ('Part IV, using it', '22 23 24'),
    ('Appendices', '25 26 27'),
]
NAMES_PAGE, NAMES_CAPTION = 'names', 'Reference'
# The guides: Markdown pages in nbs/guides/, in this order (a guide not listed here comes after these, by name).
GUIDES = ['chapters', 'training', 'using', 'experiments', 'benchmarks', 'gpu_check', 'contributing']
GUIDES_CAPTION = 'Guides'

_re_chapter_file = re.compile(r'^(\d\d)[a-z]?_\w+\.ipynb$')


def settings():
    cp = configparser.ConfigParser(delimiters=['='])
    cp.read(ROOT / 'settings.ini', encoding='utf-8')
    return cp['DEFAULT']


def chapter_number(name):
    "The number a chapter is cited by in prose: '05' for 05_performer, '23' for 23_contract."
    return name.split('_', 1)[0]


def chapters(only=None):
    "[(caption, [notebook stem, ...]), ...] from nbs/ and PARTS; the home page is not in a part."
    stems = sorted(p.stem for p in NBS.glob('*.ipynb') if _re_chapter_file.match(p.name))
    if only: stems = [s for s in stems if s in only]
    by_num = {n: cap for cap, nums in PARTS for n in nums.split()}
    parts = {cap: [] for cap, _ in PARTS}
    for s in stems:
        if s == HOME: continue
        cap = by_num.get(s[:2])
        if cap is None:
            print(f'site: {s}.ipynb has a number that no part in tools/site/build.py PARTS lists; shown under "Other"',
                  file=sys.stderr)
            cap = 'Other'
        parts.setdefault(cap, []).append(s)
    return [(cap, ss) for cap, ss in parts.items() if ss]


def chapter_targets(stems):
    """{'07': '07_backbone', '11': '11a_images', '11b': '11b_loader', ...}: where 'chapter NN' in prose links to (the
    home page only if alone). A chapter of several notebooks (11a, 11b, ...) starts at its first."""
    res = {}
    for s in sorted(stems):
        num = chapter_number(s)
        for key in dict.fromkeys([num, num[:2]]):
            if key not in res or res[key] == HOME: res[key] = s
    return res


# ---------------------------------------------------------------------------------------------------------------
# Notebook preprocessing

_re_directive = re.compile(r'^\s*#\s*\|\s*([\w-]+)\s*:?\s*(.*?)\s*$')
# Spans of markdown that the chapter linker must leave alone: code, math, links, HTML tags, headings.
_re_protect = re.compile(r'```.*?```|~~~.*?~~~|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]+\$|!?\[[^\]]*\]\([^)]*\)|<[^>\n]+>'
                         r'|^#{1,6} [^\n]*$', re.S | re.M)
_num = r'\d\d[a-z]?(?!\w)'
_re_chap = re.compile(r"\b(?P<word>[Cc]hapters?)(?P<sp>\s+)(?P<list>" + _num +
                      r"(?:(?:\s*,\s*|\s+and\s+|\s+or\s+|\s+to\s+|\s*[-\u2013]\s*)" + _num + r")*)")


_re_stem = re.compile(r'(?<![\w/.#-])(\d\d[a-z]?_[a-z0-9_]*[a-z0-9])(?![\w-]|\.\w)')
_re_nblink = re.compile(r'(!?)\[([^\]]*)\]\((\d\d[a-z]?_\w+)\.ipynb(#[^)\s]*)?\)')


def link_chapters(text, targets, self_stem):
    """'chapter 07' -> '[chapter 07](07_backbone.ipynb)', 'chapters 03 and 04' links each number, a bare '00_core'
    links to that chapter; a link to a notebook that is not in the site (a partial build) becomes its text."""
    stems = set(targets.values())
    def repl(m):
        nums = re.findall(_num, m['list'])
        if not any(n in targets for n in nums): return m[0]
        def one(n): return f'[{n}]({targets[n]}.ipynb)' if n in targets and targets[n] != self_stem else n
        if m['word'].lower() == 'chapter' and len(nums) == 1:
            n = nums[0]
            return f'[{m[0]}]({targets[n]}.ipynb)' if targets.get(n, self_stem) != self_stem else m[0]
        return m['word'] + m['sp'] + re.sub(_num, lambda k: one(k[0]), m['list'])
    def prose(t):
        t = _re_chap.sub(repl, t)
        return _re_stem.sub(lambda m: f'[{m[1]}]({m[1]}.ipynb)' if m[1] in stems and m[1] != self_stem else m[1], t)
    def protected(t):
        return _re_nblink.sub(lambda m: m[0] if m[1] or m[3] in stems else m[2], t)
    out, pos = [], 0
    for p in _re_protect.finditer(text):
        out.append(prose(text[pos:p.start()])); out.append(protected(p[0])); pos = p.end()
    out.append(prose(text[pos:]))
    return ''.join(out)


_re_inline_math = re.compile(r'(?<![\\$])\$(?![$\s])([^$\n]+?)(?<!\s)\$')


def table_math(text):
    """A `|` inside `$...$` in a markdown table row ends the cell for MyST (as for GitHub and Pandoc), though
    Jupyter reads the math first: there `|` becomes `\\vert` and `\\|` becomes `\\Vert`, the same symbols."""
    def fix(m): return '$' + m[1].replace('\\|', '\\Vert ').replace('|', '\\vert ').rstrip() + '$'
    return '\n'.join(_re_inline_math.sub(fix, l) if l.lstrip().startswith('|') else l for l in text.split('\n'))


def split_directives(src):
    "nbdev's `#| key: value` lines at the top of a code cell -> ({key: value}, the rest of the source)."
    lines, dirs, i = src.splitlines(keepends=True), {}, 0
    while i < len(lines):
        m = _re_directive.match(lines[i])
        if not m:
            if lines[i].strip() == '': i += 1; continue
            break
        dirs[m[1]] = m[2]; i += 1
    return dirs, ''.join(lines[i:])


_re_guidelink = re.compile(r'\[([^\]]*)\]\(guides/(\w+)\.md(?:#[^)\s]*)?\)')


def md_cell(src, cid):
    return {'cell_type': 'markdown', 'id': cid, 'metadata': {}, 'source': src}


def preprocess(nb, stem, targets, anchors, cfg, built_guides=None):
    """A copy of notebook `nb` as this site shows it (see the module's docstring); a link to a guide that is not in
    `built_guides` (a partial build) becomes its text."""
    cells, title_done = [], False
    git_url, branch = cfg['git_url'].rstrip('/'), cfg.get('branch', 'main')
    for c in nb['cells']:
        c = json.loads(json.dumps(c))
        src = ''.join(c['source']) if isinstance(c['source'], list) else c['source']
        tags = c.setdefault('metadata', {}).setdefault('tags', [])
        if c['cell_type'] == 'code':
            dirs, rest = split_directives(src)
            if 'default_exp' in dirs or 'hide' in dirs or dirs.get('include') == 'false': continue
            if dirs.get('echo') == 'false': tags.append('remove-input')
            if dirs.get('output') == 'false': tags.append('remove-output')
            src = rest
            if not src.strip() and not c.get('outputs'): continue
            for o in c.get('outputs', []):  # markdown that a cell displays: its links too
                md = o.get('data', {}).get('text/markdown')
                if md is not None:
                    md = ''.join(md) if isinstance(md, list) else md
                    o['data']['text/markdown'] = table_math(link_chapters(md, targets, stem))
            ids = anchors.get(c.get('id'), [])
            if ids:
                cells.append(md_cell(''.join(f'<span class="name-anchor" id="{html.escape(i)}"></span>' for i in ids),
                                     f"a{c['id']}"[:60]))
        elif c['cell_type'] == 'markdown':
            if not title_done and src.lstrip().startswith('# '):
                title_done = True
                if stem != HOME:  # the number readers cite, on the page and in the sidebar
                    src = re.sub(r'^(\s*)# ', lambda m: f'{m[1]}# {chapter_number(stem)} \u00b7 ', src, count=1)
                c['source'] = link_chapters(src, targets, stem)
                cells.append(c)
                colab = f'https://colab.research.google.com/github/{git_url.split("github.com/", 1)[-1]}/blob/{branch}/nbs/{stem}.ipynb'
                cells.append(md_cell(
                    f'<p class="chapter-links">This page is the notebook <code>nbs/{stem}.ipynb</code> with its outputs: '
                    f'<a href="notebooks/{stem}.ipynb" download>download the notebook</a> \u00b7 '
                    f'<a href="{colab}">open it in Colab</a></p>', 'chapterlinks'))
                continue
            src = table_math(link_chapters(src, targets, stem))
            if built_guides is not None:
                src = _re_guidelink.sub(lambda m: m[0] if m[2] in built_guides else m[1], src)
        c['source'] = src
        if not tags: del c['metadata']['tags']
        cells.append(c)
    out = dict(nb); out['cells'] = cells
    return out


# ---------------------------------------------------------------------------------------------------------------
# The index of the library's names

_re_marker = re.compile(r'^# %% (?:\.\./)+nbs/(?P<nb>[\w.-]+)\.ipynb(?: #(?P<id>[\w-]+))?')


def library_names():
    """[(module, notebook stem, [(name, cell id or None), ...]), ...] for the public names in `_modidx.py`, in the
    order the chapters come; the cell is the one of the notebook that defines the name (from the `# %%` markers)."""
    ns = {}
    exec((LIB / '_modidx.py').read_text(encoding='utf-8'), ns)
    res = []
    for mod, syms in ns['d']['syms'].items():
        path = ROOT / (next(iter(syms.values()))[1] if syms else mod.replace('.', '/') + '.py')
        if not path.exists(): continue
        text = path.read_text(encoding='utf-8')
        if not re.search(r'File to edit: (?:\.\./)+nbs/[\w./-]+\.ipynb', text): continue
        lines, marks = text.splitlines(), []
        for i, l in enumerate(lines, 1):
            mm = _re_marker.match(l)
            if mm: marks.append((i, mm['nb'], mm['id']))
        # the notebook whose cells fill the module (its `#| default_exp`)
        chapters = [nb for _, nb, _ in marks]
        if not chapters: continue
        stem = max(sorted(set(chapters)), key=chapters.count)
        where = {}
        for node in ast.parse(text).body:
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): names = [node.name]
            elif isinstance(node, ast.Assign): names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name): names = [node.target.id]
            line = min([node.lineno] + [d.lineno for d in getattr(node, 'decorator_list', [])])
            prev = [mk for mk in marks if mk[0] < line]
            for n in names:
                if prev and prev[-1][1] == stem: where.setdefault(n, prev[-1][2])
        top = sorted({k[len(mod) + 1:] for k in syms if '.' not in k[len(mod) + 1:]}, key=str.lower)
        top = [n for n in top if not n.startswith('_')]
        if top: res.append((mod, stem, [(n, where.get(n)) for n in top]))
    return sorted(res, key=lambda r: r[1])


def names_page(libnames, built, titles):
    "The markdown of the index page; names of chapters that are not built are left out."
    rows = ['# Index of the library\'s names\n\n'
            'Every public name of the library `t2t_course`, module by module in the order of the chapters, each '
            'linked to the cell of the chapter that builds it. `import t2t_course` gives `create_model`, '
            '`list_models` and `T2TViT`; the other names come from their modules, e.g. '
            '`from t2t_course.models.performer import TokenPerformer`.\n']
    for mod, stem, names in libnames:
        if stem not in built: continue
        links = ' '.join(f'<a class="name-link" href="{stem}.html' + (f'#{html.escape(mod + "." + n)}' if cid else '')
                         + f'"><code>{html.escape(n)}</code></a>' for n, cid in names)
        rows.append(f'## {mod}\n\n<p class="names-chapter">Built in <a href="{stem}.html">'
                    f'{html.escape(titles.get(stem, stem))}</a> ({len(names)} names)</p>\n'
                    f'<p class="names-list">{links}</p>\n')
    return '\n'.join(rows)


def name_anchors(libnames):
    "{cell id: [anchor id, ...]} for every name whose defining cell is known."
    res = {}
    for mod, stem, names in libnames:
        for n, cid in names:
            if cid: res.setdefault((stem, cid), []).append(f'{mod}.{n}')
    return res


def guides():
    "The guides' names (`nbs/guides/<name>.md`), in the order of `GUIDES`, then any other by name."
    found = {p.stem for p in (NBS / 'guides').glob('*.md')}
    return [g for g in GUIDES if g in found] + sorted(found - set(GUIDES))


_re_mdlink = re.compile(r'(!?)\[([^\]]*)\]\(([^)\s]+)\)')


def guide_page(text, targets, cfg, built_guides):
    """A guide as this site shows it: "chapter 07" linked to its page, links into the repository outside nbs/
    (`../../benchmarks/models.py`) to the repository on GitHub, links to chapters and guides not built left as text."""
    git_url, branch = cfg['git_url'].rstrip('/'), cfg.get('branch', 'main')
    text = link_chapters(text, {k: f'../{v}' for k, v in targets.items()}, None)
    stems = set(targets.values())
    def fix(m):
        bang, label, url = m[1], m[2], m[3]
        if bang or re.match(r'[a-z]+:|#', url): return m[0]
        path, _, frag = url.partition('#')
        if path.startswith('../../'): return f'[{label}]({git_url}/blob/{branch}/{path[6:]}{"#" + frag if frag else ""})'
        nb = re.fullmatch(r'\.\./(\d\d[a-z]?_\w+)\.ipynb', path)
        if nb and nb[1] not in stems: return label
        if path.endswith('.md') and '/' not in path and path[:-3] not in built_guides: return label
        return m[0]
    return table_math(_re_mdlink.sub(fix, text))


# ---------------------------------------------------------------------------------------------------------------
# Configuration and table of contents

def yaml_str(s): return json.dumps(s, ensure_ascii=False)  # JSON strings are YAML strings


def toc_yml(parts, with_names, guide_names=()):
    out = ['format: jb-book', f'root: {HOME}', 'parts:']
    for cap, stems in parts:
        out += [f'  - caption: {yaml_str(cap)}', '    chapters:'] + [f'      - file: {s}' for s in stems]
    if guide_names:
        out += [f'  - caption: {yaml_str(GUIDES_CAPTION)}', '    chapters:'] + [f'      - file: guides/{g}' for g in guide_names]
    if with_names: out += [f'  - caption: {NAMES_CAPTION}', '    chapters:', f'      - file: {NAMES_PAGE}']
    return '\n'.join(out) + '\n'


MATHJAX = ('mathjax', '3.2.2')  # from the npm registry: its es5/ components, copied into _site/_static/mathjax/
MATHJAX_PARTS = ['tex-svg-full.js', 'a11y', 'ui', 'sre']  # one script with every TeX extension; what its menu loads
MATHJAX3_CONFIG = {
    # Sphinx writes math as \( \) and \[ \] inside class="math" elements, and MyST marks each page's sections
    # tex2jax_ignore: so only those elements are typeset, and a `$` or `\(` anywhere else stays as it is.
    'tex': {'inlineMath': [['\\(', '\\)']], 'displayMath': [['\\[', '\\]']], 'processEscapes': False,
            'processEnvironments': True, 'tags': 'none'},
    'options': {'ignoreHtmlClass': 'tex2jax_ignore|mathjax_ignore',
                'processHtmlClass': 'tex2jax_process|mathjax_process|math|output_area',
                'menuOptions': {'settings': {'zoom': 'Click'}}},  # a formula drawn smaller to fit: click to zoom
    # SVG output draws glyphs as paths: no web fonts to fetch, so the pages look the same from file:// and http://
    'svg': {'fontCache': 'global'},
}
# Jupyter Book's extensions, less sphinx_thebe (its "live code" button needs a Binder server and a CDN),
# sphinx_comments and intersphinx (network services); site_ext is tools/site/site_ext.py.
EXTENSIONS = ['sphinx_togglebutton', 'sphinx_copybutton', 'myst_nb', 'jupyter_book', 'sphinx_external_toc',
              'sphinx_design', 'sphinx_book_theme', 'site_ext']


def config_yml(cfg):
    repo_url = cfg['git_url'].rstrip('/')
    conf = {
        'title': cfg['title'],
        'author': cfg['author'],
        'copyright': cfg['copyright'].split(',')[0].strip(),
        'only_build_toc_files': True,
        'exclude_patterns': ['_build', '**.ipynb_checkpoints'],
        'execute': {'execute_notebooks': 'off'},
        'parse': {'myst_enable_extensions': ['amsmath', 'colon_fence', 'dollarmath', 'linkify'],
                  'myst_dmath_double_inline': True, 'myst_heading_anchors': 3,
                  'myst_linkify_fuzzy_links': False},  # README.md, train.py: not web addresses (.md, .py)
        'html': {'use_repository_button': True, 'use_issues_button': False, 'use_edit_page_button': False,
                 'use_multitoc_numbering': False, 'home_page_in_navbar': True, 'baseurl': '',
                 'extra_footer': ''},
        'launch_buttons': {'notebook_interface': 'classic', 'colab_url': 'https://colab.research.google.com',
                           'thebe': False, 'binderhub_url': ''},
        'repository': {'url': repo_url, 'path_to_book': 'nbs', 'branch': cfg.get('branch', 'main')},
        'latex': {'use_jupyterbook_latex': False},
        'sphinx': {
            'local_extensions': {'site_ext': str(HERE)},
            'config': {
                'extensions': EXTENSIONS,
                'mathjax_path': 'mathjax/tex-svg-full.js',  # relative to _static/: the copy put there after the build
                'mathjax3_config': MATHJAX3_CONFIG,
                'myst_update_mathjax': False,
                'html_static_path': [str(HERE / 'static')],
                'html_css_files': ['site.css'],
                'html_js_files': [],
                'html_show_sourcelink': False,
                'html_context': {'default_mode': 'light'},  # figures are drawn on white
                'html_last_updated_fmt': None,
                'html_theme_options': {
                    'repository_url': repo_url, 'path_to_docs': 'nbs', 'repository_branch': cfg.get('branch', 'main'),
                    'use_repository_button': True, 'use_download_button': True, 'use_fullscreen_button': False,
                    'home_page_in_toc': True, 'show_navbar_depth': 1, 'show_toc_level': 2,
                    'launch_buttons': {'colab_url': 'https://colab.research.google.com', 'notebook_interface': 'classic'},
                    'navigation_with_keys': False, 'article_header_start': ['toggle-primary-sidebar'],
                    'icon_links': [], 'logo': {'text': cfg['title']},
                },
                'nb_merge_streams': True,
                # the cells tagged hide-cell are the exercises' solutions (collapsed, as in Jupyter)
                'nb_code_prompt_show': 'Show the solution', 'nb_code_prompt_hide': 'Hide the solution',
                'nb_render_markdown_format': 'myst',  # markdown outputs: math, and links to chapters, as in cells
                'nb_output_stderr': 'show',
                'suppress_warnings': ['mystnb.unknown_mime_type', 'myst.header'],
                'myst_footnote_transition': False,
                'linkcheck_ignore': ['.*'],
            },
        },
    }
    return json.dumps(conf, indent=1, ensure_ascii=False) + '\n'  # JSON is YAML


def sidebar_yml(parts):
    "nbs/sidebar.yml for Quarto (nbdev_preview / nbdev_docs), from the same parts as this site's sidebar."
    out = ['website:', '  sidebar:', '    contents:', f'      - {HOME}.ipynb']
    for cap, stems in parts:
        out += [f'      - section: {yaml_str(cap)}', '        contents:'] + [f'          - {s}.ipynb' for s in stems]
    return '\n'.join(out) + '\n'


def write_if_changed(path, text):
    "Write only on a change, so that Sphinx's incremental build re-reads only what changed."
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text(encoding='utf-8') == text: return False
    path.write_text(text, encoding='utf-8'); return True


def mathjax_dir():
    """MathJax's browser components, from the npm registry's package (`npm pack`, once: kept in
    _site_build/cache/), as a folder to copy into the site."""
    name, version = MATHJAX
    cache = ROOT / '_site_build' / 'cache'
    d = cache / f'{name}-{version}'
    if (d / 'tex-svg-full.js').exists(): return d
    import subprocess, tarfile, tempfile
    npm = shutil.which('npm')
    if not npm: sys.exit(f'site: npm is needed once, to fetch MathJax ({name}@{version}) from the npm registry')
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        print(f'site: fetching {name}@{version} with npm', flush=True)
        subprocess.run([npm, 'pack', f'{name}@{version}', '--silent', '--pack-destination', tmp], check=True,
                       stdout=subprocess.DEVNULL)
        tgz = next(Path(tmp).glob('*.tgz'))
        part = Path(tmp) / 'part'
        with tarfile.open(tgz) as t:
            keep = ('package/LICENSE',) + tuple(f'package/es5/{p}' for p in MATHJAX_PARTS)
            members = [m for m in t.getmembers() if m.isfile() and m.name.startswith(keep)]
            try: t.extractall(part, members=members, filter='data')
            except TypeError: t.extractall(part, members=members)  # a Python without tarfile's filters
        shutil.copyfile(part / 'package' / 'LICENSE', part / 'package' / 'es5' / 'LICENSE')
        (part / 'package' / 'es5').rename(d)
    return d


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', default=str(ROOT / '_site'), help='output folder (default _site)')
    ap.add_argument('--scratch', default=None, help='scratch folder (default _site_build, or OUT.build for --only)')
    ap.add_argument('--only', default='', help='comma-separated notebook stems to build (the home page is always in)')
    ap.add_argument('--jobs', type=int, default=int(os.environ.get('SITE_JOBS', '0')) or min(2, os.cpu_count() or 1))
    ap.add_argument('--sidebar-only', action='store_true', help='only (re)write nbs/sidebar.yml')
    ap.add_argument('--no-sidebar', action='store_true', help='do not touch nbs/sidebar.yml')
    ap.add_argument('--fresh', action='store_true', help='rebuild every page (no incremental build)')
    a = ap.parse_args(argv)
    t0 = time.time()
    cfg = settings()
    only = {s.strip() for s in a.only.split(',') if s.strip()} | {HOME} if a.only else None
    parts = chapters(only)
    if not only and not a.no_sidebar:
        if write_if_changed(NBS / 'sidebar.yml', sidebar_yml(parts)): print('site: wrote nbs/sidebar.yml')
        if a.sidebar_only: return 0
    out = Path(a.out).resolve()
    scratch = Path(a.scratch).resolve() if a.scratch else (ROOT / '_site_build' if not only else out.with_name(out.name + '.build'))
    src = scratch / 'src'
    stems = [HOME] + [s for _, ss in parts for s in ss]
    if not (NBS / f'{HOME}.ipynb').exists(): sys.exit(f'site: no nbs/{HOME}.ipynb (the home page)')
    targets = chapter_targets(stems)
    libnames = library_names()
    anchors = name_anchors(libnames)
    titles, wanted = {}, {'_config.yml', '_toc.yml', f'{NAMES_PAGE}.md'}
    guide_names = [g for g in guides() if not only or 'guides' in only or f'guides/{g}' in only]
    for s in stems:
        nb = json.loads((NBS / f'{s}.ipynb').read_text(encoding='utf-8'))
        pnb = preprocess(nb, s, targets, {cid: ids for (st, cid), ids in anchors.items() if st == s}, cfg, set(guide_names))
        title = next((l[2:].strip() for c in pnb['cells'] if c['cell_type'] == 'markdown'
                      for l in (''.join(c['source'])).splitlines() if l.startswith('# ')), s)
        titles[s] = title
        write_if_changed(src / f'{s}.ipynb', json.dumps(pnb, indent=1, ensure_ascii=False) + '\n')
        wanted.add(f'{s}.ipynb')
    write_if_changed(src / f'{NAMES_PAGE}.md', names_page(libnames, set(stems), titles))
    for g in guide_names:
        write_if_changed(src / 'guides' / f'{g}.md',
                         guide_page((NBS / 'guides' / f'{g}.md').read_text(encoding='utf-8'), targets, cfg, set(guide_names)))
        wanted.add(f'guides/{g}.md')
    write_if_changed(src / '_toc.yml', toc_yml(parts, True, guide_names))
    write_if_changed(src / '_config.yml', config_yml(cfg))
    for p in [*src.iterdir(), *(src / 'guides').glob('*.md')]:  # a chapter or guide renamed or removed since the last build
        if p.is_file() and str(p.relative_to(src)) not in wanted: p.unlink()
    print(f'site: {len(stems)} pages from nbs/ in {len(parts)} parts, {len(guide_names)} guides; building with {a.jobs} job(s)',
          flush=True)

    from jupyter_book.sphinx import build_sphinx
    html_out = scratch / '_build' / 'html'
    if a.fresh and (scratch / '_build').exists(): shutil.rmtree(scratch / '_build')
    res = build_sphinx(str(src), str(html_out), use_external_toc=True, noconfig=True,
                       path_config=str(src / '_config.yml'), builder='html', jobs=a.jobs, quiet=True,
                       confoverrides={'external_toc_path': str(src / '_toc.yml'), 'latex_individualpages': False},
                       freshenv=a.fresh)
    if res != 0: sys.exit(f'site: the Sphinx build failed ({res})')

    # The local MathJax, and each chapter's notebook as committed (the pages' download links point there).
    mj = html_out / '_static' / 'mathjax'
    if not (mj / 'tex-svg-full.js').exists(): shutil.copytree(mathjax_dir(), mj, dirs_exist_ok=True)
    (html_out / 'notebooks').mkdir(exist_ok=True)
    for s in stems:
        shutil.copyfile(NBS / f'{s}.ipynb', html_out / 'notebooks' / f'{s}.ipynb')
        if (html_out / '_sources' / f'{s}.ipynb').exists():  # the theme's download button
            shutil.copyfile(NBS / f'{s}.ipynb', html_out / '_sources' / f'{s}.ipynb')
    (html_out / '.nojekyll').touch()  # GitHub Pages: serve _static/ and _images/ as they are
    for folder, suffix in ((html_out, '.html'), (html_out / 'notebooks', '.ipynb'), (html_out / '_sources', '.ipynb')):
        for p in folder.glob(f'*{suffix}'):  # pages of chapters renamed or removed since an earlier build: Sphinx keeps them
            if _re_chapter_file.match(p.stem + '.ipynb') and p.stem not in stems: p.unlink()
    for p in (html_out / 'guides').glob('*.html'):
        if p.stem not in guide_names: p.unlink()
    tmp = out.with_name(out.name + '.tmp')
    if tmp.exists(): shutil.rmtree(tmp)
    shutil.copytree(html_out, tmp, ignore=shutil.ignore_patterns('.buildinfo', '.doctrees'))
    if out.exists(): shutil.rmtree(out)
    tmp.rename(out)
    print(f'site: built {out} ({len(stems) + len(guide_names) + 1} pages) in {time.time() - t0:.0f} s; open {out}/index.html')
    return 0


if __name__ == '__main__':
    sys.exit(main())
