"""A small Sphinx extension for the course's website (loaded by tools/site/build.py's _config.yml)."""


def setup(app):
    # The MathJax script on every page, not only on pages whose markdown has math: outputs and the names index are
    # rendered the same way everywhere, and every page can be checked for it.
    app.set_html_assets_policy('always')
    # sphinx-external-toc 1.1 always loads sphinx_multitoc_numbering, which does not say that it can read in
    # parallel, so Sphinx falls back to one process. It only renumbers the table of contents after the reading
    # (and this site numbers nothing), so the pages are read in parallel all the same.
    # Jupyter Book passes its `comments` settings on whether or not sphinx_comments (left out here) is loaded.
    app.add_config_value('comments_config', {}, 'html')
    ext = app.extensions.get('sphinx_multitoc_numbering')
    if ext is not None and ext.parallel_read_safe is None: ext.parallel_read_safe = True
    return {'parallel_read_safe': True, 'parallel_write_safe': True}
