"""The course's website (tools/site.sh, tools/site/build.py), without a browser: a two-chapter build (the home page and
chapter 05, which has math, figures and collapsed solutions) whose pages have a title and the local MathJax, link only
inside the site or to an allow-list of outside addresses, and load nothing from outside; the chapter linker; the
Quarto sidebar in step with nbs/. tools/site_check.sh opens every page of the full site in Chromium.

The build needs the `docs` extra (tools/test.sh installs it); without Jupyter Book the build tests are skipped."""
import importlib.util, json, re, subprocess, sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit, unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location('site_build', ROOT / 'tools' / 'site' / 'build.py')
site = importlib.util.module_from_spec(spec); spec.loader.exec_module(site)

CHAPTERS = ['00_overview', '05_performer']
GUIDE = 'guides/training'  # a guide, built beside the two chapters: its links to chapters not built become text
# Where a page may link outside the site: the repository, Colab's copy of a notebook, and cited sources.
ALLOWED_HOSTS = {'github.com', 'colab.research.google.com', 'arxiv.org', 'pytorch.org', 'docs.pytorch.org',
                 'huggingface.co', 'www.image-net.org', 'image-net.org', 'numpy.org', 'docs.python.org'}
needs_jb = pytest.mark.skipif(importlib.util.find_spec('jupyter_book') is None,
                              reason="Jupyter Book is not installed (the docs extra: pip install -e '.[docs]')")


class Refs(HTMLParser):
    "The title, ids, and every href/src of a page (a, link, script, img)."
    def __init__(self):
        super().__init__(); self.title, self.ids, self.refs, self._t = '', set(), [], False
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if 'id' in a: self.ids.add(a['id'])
        if tag == 'title': self._t = True
        for k in ('href', 'src'):
            if a.get(k) is not None: self.refs.append((tag, k, a[k]))
    def handle_endtag(self, tag):
        if tag == 'title': self._t = False
    def handle_data(self, data):
        if self._t: self.title += data


def parse(p):
    r = Refs(); r.feed(p.read_text(encoding='utf-8')); return r


@pytest.fixture(scope='module')
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp('site') / '_site'
    subprocess.run([sys.executable, str(ROOT / 'tools' / 'site' / 'build.py'), '--only', ','.join(CHAPTERS + [GUIDE]),
                    '--out', str(out)], check=True, cwd=ROOT)
    return out


@needs_jb
def test_pages_build(built):
    for name in ['index.html', 'names.html', f'{GUIDE}.html'] + [f'{c}.html' for c in CHAPTERS]: assert (built / name).is_file(), name
    assert 'url=00_overview.html' in (built / 'index.html').read_text()  # the overview is the home page
    for c in CHAPTERS:  # the notebook as committed, to download
        assert (built / 'notebooks' / f'{c}.ipynb').read_bytes() == (ROOT / 'nbs' / f'{c}.ipynb').read_bytes()
    assert (built / '_static' / 'mathjax' / 'tex-svg-full.js').is_file()


@needs_jb
def test_title_math_and_solutions(built):
    title = site.settings()['title']
    for c in CHAPTERS + ['names']:
        p = parse(built / f'{c}.html')
        assert p.title.strip().endswith(title) and len(p.title.strip()) > len(title), (c, p.title)
        scripts = [v for t, k, v in p.refs if t == 'script' and k == 'src']
        assert '_static/mathjax/tex-svg-full.js' in scripts, c  # the local copy, by a relative path
    html = (built / '05_performer.html').read_text(encoding='utf-8')
    assert '<h1>05 \u00b7 Performer attention' in html
    assert html.count('class="math notranslate nohighlight"') > 20  # dollar math became math nodes
    assert 'tag_hide-cell' in html                              # solutions collapsed
    assert '#| export' not in html and 'default_exp' not in html  # nbdev directives are not shown
    assert re.search(r'<img[^>]+src="_images/[^"]+\.png"', html)  # figures from the committed outputs
    assert 'colab.research.google.com/github/' in html and 'href="notebooks/05_performer.ipynb"' in html


@needs_jb
def test_links_stay_inside(built):
    pages = sorted(p for p in built.rglob('*.html') if p.parent == built or p.parent.name == 'guides')
    ids = {p.name: parse(p).ids for p in pages}
    outside = set()
    for page in pages:
        for tag, attr, ref in parse(page).refs:
            u = urlsplit(ref)
            if u.scheme in ('mailto', 'javascript', 'data'): continue
            if u.scheme or u.netloc:
                # pages load nothing from outside (scripts, styles, images): only a link may leave the site
                assert tag == 'a', f'{page.name} loads {ref} from outside the site'
                assert u.netloc in ALLOWED_HOSTS, f'{page.name} links to {ref}: not on the allow-list'
                if u.netloc == 'github.com': assert u.path.startswith('/t2t-course/t2t-course'), ref
                outside.add(u.netloc); continue
            target = (page.parent / unquote(u.path)).resolve() if u.path else page
            assert target.is_relative_to(built.resolve()), f'{page.name}: {ref} points outside the site'
            if target.is_dir(): target = target / 'index.html'
            assert target.exists(), f'{page.name}: broken link {ref}'
            if u.fragment and target.suffix == '.html' and target.name in ids:
                assert unquote(u.fragment) in ids[target.name], f'{page.name}: no anchor for {ref}'
    assert 'colab.research.google.com' in outside


@needs_jb
def test_names_index(built):
    html = (built / 'names.html').read_text(encoding='utf-8')
    assert 'href="05_performer.html#t2t_course.models.performer.TokenPerformer"' in html
    assert 'id="t2t_course.models.performer.TokenPerformer"' in (built / '05_performer.html').read_text(encoding='utf-8')


def test_link_chapters():
    targets = {'00': '00_core', '03': '03_attention', '04': '04_t2t_layer', '07': '07_backbone', '23': '23_contract'}
    f = lambda s: site.link_chapters(s, targets, '05_performer')
    assert f('as in chapter 07.') == 'as in [chapter 07](07_backbone.ipynb).'
    assert f("chapter 00's switch") == "[chapter 00](00_core.ipynb)'s switch"
    assert f('chapters 03 and 04') == 'chapters [03](03_attention.ipynb) and [04](04_t2t_layer.ipynb)'
    assert f('## A heading\n\nas in chapter 03') == '## A heading\n\nas in [chapter 03](03_attention.ipynb)'
    assert f('Chapters 03-07 and chapter 23') == ('Chapters [03](03_attention.ipynb)-[07](07_backbone.ipynb) '
                                                   'and [chapter 23](23_contract.ipynb)')
    assert f('chapter 07_backbone, then 03_attention.') == ('chapter [07_backbone](07_backbone.ipynb), then '
                                                          '[03_attention](03_attention.ipynb).')
    assert f('[08](08_models.ipynb) and [03](03_attention.ipynb)') == '08 and [03](03_attention.ipynb)'  # 08: not built
    for same in ['`chapter 07`', 'chapter 05', 'chapter 99', '$chapter 07$', '[chapter 07](x.ipynb)', '## In chapter 07',
                 'nbs/07_backbone.ipynb', '`03_attention`', '05_performer']:
        assert f(same) == same, same


def test_parts_and_sidebar():
    "Every chapter in nbs/ has a part, and nbs/sidebar.yml (Quarto's) lists them as the site does."
    parts = site.chapters()
    assert 'Other' not in dict(parts), 'a chapter whose number no part lists: add it to PARTS in tools/site/build.py'
    assert [c for c, _ in parts][:4] == [c for c, _ in site.PARTS][:4]
    assert (ROOT / 'nbs' / 'sidebar.yml').read_text() == site.sidebar_yml(parts), \
        'nbs/sidebar.yml is not in step with nbs/: run bash tools/site.sh (or python tools/site/build.py --sidebar-only)'
    for cap, stems in parts:  # each chapter's title cell names the part it is in
        for s in stems:
            nb = json.loads((ROOT / 'nbs' / f'{s}.ipynb').read_text(encoding='utf-8'))
            title = next(''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'markdown')
            want = 'Appendix' if cap == 'Appendices' else cap
            assert f'*{want}' in title, (s, cap)


def test_a_chapter_of_sections_starts_at_its_first():
    "'chapter 11' links to 11a, 'chapter 11b' to 11b; a chapter of one notebook keeps its number."
    t = site.chapter_targets(['00_overview', '00_core', '07_backbone', '11a_images', '11b_loader'])
    assert t == {'00': '00_core', '07': '07_backbone', '11': '11a_images', '11a': '11a_images', '11b': '11b_loader'}
    assert site.link_chapters('chapters 11 and 11b', t, '05_performer') == \
        'chapters [11](11a_images.ipynb) and [11b](11b_loader.ipynb)'


def test_every_guide_has_its_place():
    "Every Markdown page in nbs/guides/ is listed in tools/site/build.py's GUIDES (its place in the sidebar), and each exists."
    on_disk = {p.stem for p in (ROOT / 'nbs' / 'guides').glob('*.md')}
    assert on_disk == set(site.GUIDES) and site.guides() == site.GUIDES


def test_a_guide_links_chapters_and_the_repository():
    "In a guide, 'chapter 05' links to its page, ../../x to the repository on GitHub, a chapter not built becomes text."
    cfg = {'git_url': 'https://github.com/t2t-course/t2t-course', 'branch': 'main'}
    t = {'05': '05_performer'}
    page = site.guide_page('See chapter 05, [the script](../../benchmarks/models.py) and [07](../07_backbone.ipynb).',
                           t, cfg, set())
    assert page == ('See [chapter 05](../05_performer.ipynb), [the script](https://github.com/t2t-course/t2t-course/blob/main/'
                    'benchmarks/models.py) and 07.')


def test_site_sh_checks_its_tools_before_building(tmp_path):
    "Without npm (and no MathJax in the cache) or without the builder, tools/site.sh stops at once with one line, before the build."
    import os, shutil
    (tmp_path / 'tools' / 'site').mkdir(parents=True)
    shutil.copy(ROOT / 'tools' / 'site.sh', tmp_path / 'tools' / 'site.sh')
    mathjax = next(l for l in (ROOT / 'tools' / 'site' / 'build.py').read_text().splitlines() if l.startswith('MATHJAX = '))
    (tmp_path / 'tools' / 'site' / 'build.py').write_text(mathjax + "\nraise SystemExit('the build ran')\n")
    (tmp_path / 'settings.ini').write_text('[DEFAULT]\ndocs_requirements = \n')
    venv = tmp_path / 'venv' / 'bin'; venv.mkdir(parents=True)
    (venv / 'activate').write_text('')
    tools = tmp_path / 'path'; tools.mkdir()
    for t in ('bash', 'dirname', 'sed', 'env'): (tools / t).symlink_to(shutil.which(t))
    for py in (venv / 'python', tools / 'python'):  # this interpreter, with its environment's packages
        py.write_text(f'#!{shutil.which("bash")}\nexec {sys.executable} "$@"\n'); py.chmod(0o755)
    env = dict(os.environ, PATH=str(tools), VENV=str(tmp_path / 'venv'))
    p = subprocess.run(['bash', str(tmp_path / 'tools' / 'site.sh')], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and 'the build ran' not in p.stderr, p.stderr
    want = 'npm is needed once, to fetch MathJax' if importlib.util.find_spec('jupyter_book') else 'Jupyter Book is not importable'
    assert want in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
