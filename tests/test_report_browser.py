"""The committed example report and the reference index.html in headless Chromium (selenium).

Skips where Chromium, its driver or selenium is missing; `.ci/run` installs Debian's
chromium and chromium-driver so that CI runs it.
"""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _example_module():
    spec = importlib.util.spec_from_file_location("example_report", ROOT / "docs" / "example_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


example = _example_module()
pytest.importorskip("selenium", reason="selenium is not installed (the test extra has it)")
if example.chromium_paths() is None:
    pytest.skip("chromium and chromium-driver are not installed (.ci/run installs them)",
                allow_module_level=True)


PAGES = [example.EXAMPLE, ROOT / "reports" / "reference" / "h200" / "index.html"]


@pytest.fixture(scope="module", params=PAGES, ids=["example", "reference"])
def page(request, tmp_path_factory):
    if not request.param.exists():
        pytest.skip(f"{request.param} is not committed")
    driver = example.headless_chromium(tmp_path_factory.mktemp("chromium-profile"), 1280, 1400)
    try:
        driver.get(request.param.resolve().as_uri())
        yield driver
    finally:
        driver.quit()


def test_console_has_no_errors(page):
    assert page.execute_script("return document.readyState") == "complete"
    logs = page.get_log("browser")
    errors = [entry for entry in logs if entry.get("level") == "SEVERE"]
    assert not errors, errors


def test_page_fetches_nothing_and_draws_its_plots(page):
    # Opened from disk with the network closed: the only resource is the page itself.
    assert page.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert page.execute_script("return document.querySelectorAll('script').length") == 0
    svgs = page.execute_script(
        "return Array.from(document.querySelectorAll('svg')).map(s => s.getBoundingClientRect().width)")
    assert len(svgs) >= 10 and min(svgs) > 200
    assert page.title.startswith("perfscope ")


def test_screenshot_is_not_blank(page):
    import numpy as np
    from PIL import Image

    image = Image.open(io.BytesIO(page.get_screenshot_as_png())).convert("RGB")
    assert image.size[0] >= 1000
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50
    background = np.array(max(colours)[1], dtype=int)
    # Text, bars and tables cover a real part of the first screen, not a few stray pixels.
    pixels = np.asarray(image, dtype=int)
    inked = (np.abs(pixels - background).sum(axis=2) > 60).mean()
    assert inked > 0.03, inked
