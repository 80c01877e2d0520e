"""A real headless browser for the console's tests: the system Chromium (Debian's
``chromium`` and ``chromium-driver``) driven by Selenium. Nothing is downloaded: the
driver's path is given, so Selenium Manager never runs.

Without the browser the tests are skipped (``make test`` says so in one line); under
``CI=true`` a missing browser is a failure (``.ci/run`` installs it).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage")
LAPTOP = (1280, 800)
PHONE = (390, 844)


def missing() -> str:
    """Why the browser tests cannot run here ("" when they can)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"no {path} (apt-get install -y chromium chromium-driver)"
    return ""


def require_browser() -> None:
    """Skip (fail under ``CI=true``) when there is no browser."""
    why = missing()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests need a browser under CI: {why}")
        pytest.skip(f"browser tests skipped: {why}")


def chrome(size: tuple[int, int] = LAPTOP):  # type: ignore[no-untyped-def]
    """A headless Chromium with a fresh profile, at ``size`` (CSS pixels)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="printery-chrome-")
    atexit.register(shutil.rmtree, profile, ignore_errors=True)  # after the browser quit
    for flag in (*FLAGS, f"--user-data-dir={profile}",
                 f"--window-size={size[0]},{size[1]}"):
        options.add_argument(flag)
    if size[0] < 500:  # narrower than a desktop window can be: emulate the phone
        options.add_experimental_option("mobileEmulation", {
            "deviceMetrics": {"width": size[0], "height": size[1], "pixelRatio": 1}})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    if size[0] >= 500:  # the page's viewport is exactly the size (the window has a frame)
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": False})
    return driver
