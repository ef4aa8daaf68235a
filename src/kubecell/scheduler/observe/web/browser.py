"""A real browser for the dashboard's tests, bench and documentation screenshot: Debian's headless chromium
driven by Selenium through Debian's chromedriver.

Nothing is downloaded: Selenium Manager (which would fetch a browser and a driver) is switched off and both
binaries are given by path; a machine without them gets ``BrowserUnavailableError`` with what to install. The
flags keep chromium off the network (no component updates, sync or background requests) and in its own
throw-away profile. Selenium is a development dependency: import this module only from tests and tools.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

CHROMIUM: Final = Path("/usr/bin/chromium")
CHROMEDRIVER: Final = Path("/usr/bin/chromedriver")
FLAGS: Final = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--hide-scrollbars")


class BrowserUnavailableError(RuntimeError):
    """No chromium or chromedriver here (Debian: ``apt-get install chromium chromium-driver``)."""


def missing() -> str | None:
    """Why no browser can run here, or None when one can."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.exists():
            return f"{path} is absent (Debian package {package!r})"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[WebDriver]:
    """A headless chromium of ``width`` x ``height`` CSS pixels, quit (and its profile removed) on exit."""
    reason = missing()
    if reason is not None:
        raise BrowserUnavailableError(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # never let Selenium Manager look for (or download) a browser or driver
    profile = tempfile.mkdtemp(prefix="kubecell-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        driver.set_page_load_timeout(60)
        driver.set_script_timeout(60)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_until(driver: WebDriver, what: str, probe: Callable[[WebDriver], Any], timeout: float = 30.0) -> Any:
    """Poll ``probe(driver)`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe(driver)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} in the browser")
        time.sleep(0.1)


def element_box(driver: WebDriver, element_id: str) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of an element in screenshot pixels (device pixel ratio applied)."""
    box = driver.execute_script(
        "const r = document.getElementById(arguments[0]).getBoundingClientRect(); const d = devicePixelRatio;"
        "return [r.left * d, r.top * d, r.right * d, r.bottom * d].map(Math.round);", element_id)
    left, top, right, bottom = (int(v) for v in box)
    return left, top, right, bottom


def distinct_colours(png: Path, box: tuple[int, int, int, int] | None = None) -> int:
    """How many distinct RGB colours the PNG (or the ``box`` of it) holds: a blank or failed drawing has a
    handful, a drawn map of VCs at several fill levels has dozens."""
    from matplotlib.image import imread

    pixels = np.asarray(imread(png))
    if box is not None:
        left, top, right, bottom = box
        pixels = pixels[max(0, top):bottom, max(0, left):right]
    rgb = np.round(pixels[..., :3] * 255).astype(np.uint32) if pixels.dtype.kind == "f" else pixels[..., :3]
    rgb = rgb.astype(np.uint32)
    packed = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    return int(np.unique(packed).size)
