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
        driver.page_url = request.param.resolve().as_uri()
        _reload(driver)
        yield driver
    finally:
        driver.quit()


def _reload(driver, fragment: str = "") -> None:
    """The page afresh (cards in their first state), optionally at #fragment, once the
    browser has finished the fragment's navigation: it opens the <details> around the target
    and applies :target after the load event, later on a large page (the reference index)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("about:blank")
    driver.get(driver.page_url + (f"#{fragment}" if fragment else ""))
    # driver.get can return while a large file:// page still reads "loading" (seen in CI).
    WebDriverWait(driver, 20).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && (!arguments[0] || "
        "document.querySelector(':target') !== null)", fragment))
    # Two animation frames: the style and the details' toggle land before the next read.
    driver.execute_async_script("const done = arguments[arguments.length - 1]; "
                                "requestAnimationFrame(() => requestAnimationFrame(done));")


def _cards(driver) -> list[dict]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('details.kernel')).map(d => ({id: d.id, "
        "open: d.open, shown: d.getClientRects().length > 0, cls: d.className}))")


def test_console_has_no_errors(page):
    assert page.execute_script("return document.readyState") == "complete"
    logs = page.get_log("browser")
    errors = [entry for entry in logs if entry.get("level") == "SEVERE"]
    assert not errors, errors


def test_page_fetches_nothing_and_draws_its_plots(page):
    # Opened from disk with the network closed: the only resource is the page itself.
    assert page.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert page.execute_script("return document.querySelectorAll('script').length") == 0
    # Closed cards lay nothing out: the plots that count are those on view when it opens.
    svgs = page.execute_script(
        "return Array.from(document.querySelectorAll('svg')).filter(s => !s.closest('details:not([open])'))"
        ".map(s => s.getBoundingClientRect().width)")
    assert len(svgs) >= 10 and min(svgs) > 200
    assert page.title.startswith("perfscope ")


def test_cards_open_and_close(page):
    from selenium.webdriver.common.by import By

    _reload(page)
    cards = _cards(page)
    opened = [c["open"] for c in cards]
    assert opened[0] and not all(opened)
    closed = next(c["id"] for c in cards if not c["open"])
    summary = page.find_element(By.CSS_SELECTOR, f"#{closed} > summary")
    summary.click()
    assert page.execute_script(f"return document.getElementById('{closed}').open")
    body = page.find_element(By.CSS_SELECTOR, f"#{closed} .body")
    assert body.is_displayed() and body.size["height"] > 100
    summary.click()
    assert not page.execute_script(f"return document.getElementById('{closed}').open")
    assert not body.is_displayed()


def test_a_kernel_link_opens_its_card(page):
    _reload(page)
    closed = next(c["id"] for c in _cards(page) if not c["open"])
    _reload(page, f"{closed}-open")
    assert page.execute_script(f"return document.getElementById('{closed}').open")
    _reload(page)


def test_filter_by_finding_shows_only_its_kernels(page):
    codes = page.execute_script(
        "return Array.from(document.querySelectorAll('i.anchor')).map(a => a.id.slice(5))")
    if not codes:
        pytest.skip("no finding on this page")
    code = codes[0]
    _reload(page, f"only-{code}")
    shown = [c for c in _cards(page) if c["shown"]]
    assert shown and all(f"f-{code}" in c["cls"].split() for c in shown)
    assert len(shown) < len(_cards(page))
    assert page.execute_script(f"return document.querySelector('p.only-{code}').offsetHeight") > 0
    _reload(page)
    assert all(c["shown"] for c in _cards(page))


def test_source_view_shows_cuda_beside_sass(page):
    """A ladder stage's hottest lines: the CUDA text on the left, its SASS on the right."""
    found = page.execute_script("""
        for (const card of document.querySelectorAll('details.kernel')) {
          const pre = card.querySelector('.src-line pre.cuda');
          if (!pre || !card.querySelector('h3').textContent.startsWith('hgemm_')) continue;
          card.open = true;
          const line = pre.closest('.src-line');
          const sass = line.querySelector('table.sass');
          const a = pre.getBoundingClientRect(), b = sass.getBoundingClientRect();
          return {cuda: pre.textContent, sass: sass.textContent, left: a.right <= b.left + 1,
                  level: Math.abs(a.top - b.top) < 80, id: card.id};
        }
        return null;""")
    if found is None:
        pytest.skip("no ladder stage with its CUDA source on this page")
    assert found["left"] and found["level"], found
    assert "HMMA" in found["sass"] or "HGMMA" in found["sass"] or "FFMA" in found["sass"]
    assert found["cuda"].strip()
    _reload(page)


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
