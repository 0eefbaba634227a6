"""Regenerate the committed example HTML report (and, with --screenshot, the README image).

    python docs/example_report.py [--screenshot]

Until the reference run holds one report per ladder stage, the example is made from the
committed H200 fixtures (the cuBLAS kernels and the small test kernels) with the ladder
overview from the committed reference ``bench.json``. ``tests/test_report_html.py``
regenerates it and requires the committed file byte for byte, and opens it in headless
Chromium. The Chromium options live here so the test and the screenshot share them.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "h200"
EXAMPLE = ROOT / "docs" / "example-report.html"
SCREENSHOT = ROOT / "docs" / "report.png"
BENCH = ROOT / "reports" / "reference" / "h200" / "bench.json"
# The many_launches capture (24 launches of the same four kernels) is left out: it would
# quadruple the page and show nothing the others do not.
INPUTS = tuple(FIXTURES / f"{name}.ncu-rep.xz" for name in (
    "cublas_sgemm_4096", "cublas_hgemm_4096", "cublas_bgemm_4096", "smem_transpose", "spill",
    "strided_copy", "float4_copy", "narrow_sol_only"))
TITLE = "perfscope diagnosis report: H200 fixtures (example)"
COMMAND = "python docs/example_report.py"

log = logging.getLogger("example_report")


def build() -> str:
    """The example page, from committed inputs only."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from perfscope.render.html import build_report

    return build_report(INPUTS, bench=BENCH, title=TITLE, command=COMMAND)


def chromium_paths() -> tuple[str, str] | None:
    """(browser, driver) of Debian's chromium and chromium-driver, or None when absent."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def headless_chromium(user_data_dir: Path, width: int = 1280, height: int = 900):
    """A selenium Chrome session on the local Chromium, offline, that records console logs."""
    import os

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    paths = chromium_paths()
    if paths is None:
        raise RuntimeError("chromium and chromedriver are not installed")
    # Selenium Manager would try to download a driver; this machine's network is closed
    # and Debian's driver is the one that matches Debian's browser.
    os.environ.setdefault("SE_OFFLINE", "true")
    opts = webdriver.ChromeOptions()
    opts.binary_location = paths[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={user_data_dir}",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(executable_path=paths[1]))


def screenshot(html: Path, png: Path, width: int = 1280, height: int = 1500) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as profile:
        driver = headless_chromium(Path(profile), width, height)
        try:
            driver.get(html.resolve().as_uri())
            driver.save_screenshot(str(png))
        finally:
            driver.quit()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--screenshot", action="store_true", help=f"also write {SCREENSHOT.name}")
    args = ap.parse_args()
    from perfscope.render.html import write_atomic

    write_atomic(EXAMPLE, build())
    log.info("wrote %s", EXAMPLE.relative_to(ROOT))
    if args.screenshot:
        # The README shows the reference run's page: the real ladder, not the fixtures.
        reference = ROOT / "reports" / "reference" / "h200" / "index.html"
        screenshot(reference if reference.exists() else EXAMPLE, SCREENSHOT)
        log.info("wrote %s", SCREENSHOT.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
