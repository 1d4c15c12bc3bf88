"""What the training tests share: a tiny ImageNet-layout folder (tests/support/images.py's `make_folder`), made once per
test module."""
import pytest

from tests.support.images import make_folder


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp('tiny_imagenet'))
