# The nbdev 2 template setup.py, without its `pkg_resources` import and version assert (current
# setuptools no longer ships pkg_resources) and with an SPDX license. All settings live in settings.ini.
from configparser import ConfigParser
import setuptools, shlex

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

cfg_keys = 'version description keywords author author_email'.split()
expected = cfg_keys + "lib_name user branch license status min_python audience language".split()
for o in expected: assert o in cfg, "missing expected setting: {}".format(o)
setup_cfg = {o:cfg[o] for o in cfg_keys}

# SPDX license expressions (setuptools deprecates the 'License ::' classifiers the template used)
licenses = {'apache2': 'Apache-2.0', 'mit': 'MIT', 'gpl2': 'GPL-2.0-only', 'gpl3': 'GPL-3.0-only', 'bsd3': 'BSD-3-Clause'}
statuses = [ '0 - Pre-Planning', '1 - Planning', '2 - Pre-Alpha', '3 - Alpha',
    '4 - Beta', '5 - Production/Stable', '6 - Mature', '7 - Inactive' ]
py_versions = '3.10 3.11 3.12 3.13'.split()

requirements = shlex.split(cfg.get('requirements', ''))
if cfg.get('pip_requirements'): requirements += shlex.split(cfg.get('pip_requirements', ''))
min_python = cfg['min_python']
lic = licenses.get(cfg['license'].lower(), cfg['license'])
dev_requirements = shlex.split(cfg.get('dev_requirements') or '')
# Optional extras, each from its own `<name>_requirements` line of settings.ini: dev (which includes timm, export and
# tensorboard), timm, export, tensorboard (`t2t_train --log tensorboard`), and docs (the website's tools, tools/site.sh).
extras = {name: shlex.split(cfg.get(f'{name}_requirements') or '') for name in ('dev', 'timm', 'export', 'tensorboard', 'docs')}
extras['dev'] += extras['timm'] + extras['export'] + extras['tensorboard']  # the dev extra runs every test, chapters 22, 24 and 18b's too

package_data = dict()
pkg_data = cfg.get('package_data', None)
if pkg_data:
    package_data[cfg['lib_name']] =  pkg_data.split() # split as multiple files might be listed
# Add package data to setup_cfg for setuptools.setup(..., **setup_cfg)
setup_cfg['package_data'] = package_data

setuptools.setup(
    name = cfg['lib_name'],
    license = lic,
    classifiers = [
        'Development Status :: ' + statuses[int(cfg['status'])],
        'Intended Audience :: ' + cfg['audience'].title(),
        'Natural Language :: ' + cfg['language'].title(),
    ] + ['Programming Language :: Python :: '+o for o in py_versions[py_versions.index(min_python):]],
    url = cfg['git_url'],
    packages = setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    py_modules = ['t2t_commands'],  # the commands' entry points, imported before torch (see its docstring)
    include_package_data = True,
    install_requires = requirements,
    extras_require=extras,
    dependency_links = cfg.get('dep_links','').split(),
    python_requires  = '>=' + cfg['min_python'],
    long_description = open('README.md', encoding='utf-8').read(),
    long_description_content_type = 'text/markdown',
    zip_safe = False,
    entry_points = {
        'console_scripts': cfg.get('console_scripts','').split(),
        'nbdev': [f'{cfg.get("lib_path")}={cfg.get("lib_path")}._modidx:d']
    },
    **setup_cfg)
