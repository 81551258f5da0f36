"""Re-take the guide's two report screenshots from a report HTML, in headless Chromium.

    for n in 256 512 1024; do
      autopar search gpt3-175b --hardware a100-80g-sxm --gpus $n --global-batch 1536 -o g$n.json
    done
    autopar report g256.json g512.json g1024.json -o report.html
    python docs/report_screenshots.py report.html          # writes docs/report-*.png

``report-screenshot.png``: the page from its header to the end of "Step time by term" (ranked
plans, why, the step-time chart and the overheads view). ``report-charts.png``: memory per stage,
a pipeline timeline, communication and scaling, with only the first two memory charts and the
first timeline left on the page (the report draws them for the best three plans of each search).
Both at a 1400-pixel-wide window, as a desktop browser shows them. Needs Debian's chromium and
chromium-driver (and selenium, Pillow: both in the test environment).
"""
from __future__ import annotations

import argparse
import io
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH = 1400
HIDE_EXTRA = """
document.querySelectorAll('#memory figure.chart').forEach((f, i) => { if (i >= 2) f.style.display = 'none'; });
document.querySelectorAll('#timeline figure.chart').forEach((f, i) => { if (i >= 1) f.style.display = 'none'; });
"""


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    os.environ["SE_OFFLINE"] = "true"          # never fetch a driver
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 "--disable-dev-shm-usage", "--proxy-server=127.0.0.1:9", f"--window-size={WIDTH},1000"):
        opts.add_argument(flag)
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


def region(driver, first: str, last: str | None) -> tuple[int, int]:
    """Top and bottom (page pixels) from element ``first``'s top to section ``last``'s bottom."""
    return tuple(driver.execute_script(
        "const a = document.querySelector(arguments[0]).getBoundingClientRect();"
        "const b = document.getElementById(arguments[1]).getBoundingClientRect();"
        "return [Math.floor(a.top + window.scrollY), Math.ceil(b.bottom + window.scrollY) + 8];",
        first, last))


def shoot(driver, top: int, bottom: int, out: str, left: int = 0, right: int = WIDTH) -> None:
    from PIL import Image
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDTH, height + 200)      # the whole page in one viewport
    png = Image.open(io.BytesIO(driver.get_screenshot_as_png()))
    png.crop((left, top, min(right, png.width), min(bottom, png.height))).save(out, optimize=True)
    driver.set_window_size(WIDTH, 1000)
    print(f"wrote {out} ({right - left}×{bottom - top})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", help="the report HTML (autopar report ... -o report.html)")
    ap.add_argument("--out", default=HERE, help="folder for the PNGs (default: docs/)")
    args = ap.parse_args()
    d = browser()
    try:
        d.get("file://" + os.path.abspath(args.report))
        top, bottom = region(d, "header", "step-time")
        shoot(d, top, bottom, os.path.join(args.out, "report-screenshot.png"))
        d.execute_script(HIDE_EXTRA)
        top, bottom = region(d, "#memory", "scaling")
        left, right = d.execute_script("const m = document.querySelector('main').getBoundingClientRect();"
                                       "return [Math.floor(m.left), Math.ceil(m.right)];")
        shoot(d, top - 8, bottom, os.path.join(args.out, "report-charts.png"), left, right)
    finally:
        d.quit()


if __name__ == "__main__":
    main()
