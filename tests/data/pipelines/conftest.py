"""The files the pipeline tests read: photo-like JPEGs (a typical one and a big one), a PNG, and the odd and broken
files of chapter 11's zoo."""
import numpy as np
import pytest
from PIL import Image

from t2t_course.data.synthetic import make_photo


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    "A typical photo (500 x 375 JPEG), a big one (1600 x 1200 JPEG), a PNG, and the odd files of chapter 11's zoo."
    d = tmp_path_factory.mktemp('files')
    Image.fromarray(make_photo()).save(d / 'photo.JPEG', quality=90)
    Image.fromarray(make_photo(1200, 1600, seed=1)).save(d / 'big.JPEG', quality=90)
    Image.fromarray(make_photo(200, 260, seed=2)).save(d / 'photo.png')
    Image.new('CMYK', (300, 260), (0, 255, 255, 0)).save(d / 'cmyk.jpg')
    Image.fromarray((np.arange(300 * 260).reshape(260, 300) % 65536).astype(np.uint16)).save(d / 'gray16.png')
    pal = Image.fromarray((np.arange(300 * 260).reshape(260, 300) % 2).astype(np.uint8), 'P')
    pal.putpalette([0, 128, 0, 255, 0, 0] + [0] * 762); pal.save(d / 'palette.png', transparency=1)
    Image.fromarray(make_photo(260, 300, seed=3)).save(d / 'png_named.JPEG', format='PNG')
    (d / 'truncated.jpg').write_bytes((d / 'photo.JPEG').read_bytes()[:3000])
    (d / 'text.jpg').write_text('not an image')
    return d
