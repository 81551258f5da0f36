"""The HTML report in headless Chromium: no console errors, every chart drawn, a non-blank
screenshot, and not one network request (Debian's chromium + chromium-driver; .ci/run installs
them). Selenium is told where the driver is, so it never looks for or downloads one."""
import json
import os
import shutil

import pytest

from autopar.report import make_report

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "report")
G = [os.path.join(FIX, f"g{n}.json") for n in (256, 512, 1024)]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
         "--window-size=1400,1000", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; "
           ".ci/run installs them)")


def start_browser():
    """Headless Chromium driven by Debian's chromedriver; nothing is looked up or downloaded."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    os.environ["SE_OFFLINE"] = "true"          # Selenium Manager: never fetch anything
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS:
        opts.add_argument(f)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)


@pytest.fixture(scope="module")
def browser():
    driver = start_browser()
    yield driver
    driver.quit()


def open_report(browser, path):
    browser.get_log("performance")  # drop what came before
    browser.get("file://" + os.path.abspath(path))
    browser.execute_script("return document.readyState")
    return browser.get_log("browser"), [json.loads(e["message"])["message"]
                                        for e in browser.get_log("performance")]


def assert_report_renders(browser, path, shot, n_plans):
    console, perf = open_report(browser, path)
    errors = [e for e in console if e["level"] in ("SEVERE", "ERROR", "WARNING")]
    assert errors == [], errors
    requested = [m["params"]["request"]["url"] for m in perf if m["method"] == "Network.requestWillBeSent"]
    assert requested and all(u.startswith(("file://", "data:")) for u in requested), requested
    # every chart is an inline SVG with a real size on the page
    charts = browser.execute_script("""
        return Array.from(document.querySelectorAll('figure.chart')).map(f => {
            const s = f.querySelector('svg'); const b = s ? s.getBoundingClientRect() : null;
            return [f.dataset.chart, !!s, b ? b.width : 0, b ? b.height : 0,
                    s ? s.querySelectorAll('path').length : 0]; });""")
    kinds = {c[0] for c in charts}
    assert {"step-time", "memory", "timeline", "comm", "scaling"} <= kinds
    for kind, has_svg, w, h, paths in charts:
        assert has_svg and w > 200 and h > 80 and paths > 5, (kind, w, h, paths)
    sections = browser.execute_script("return Array.from(document.querySelectorAll('section')).map(s => s.id)")
    assert sections == ["ranked", "why", "step-time", "memory", "timeline", "comm", "scaling", "run", "diff"]
    rows = browser.execute_script("return document.querySelectorAll('#ranked tbody tr').length")
    assert rows == n_plans
    # the screenshot is not blank: many colours, and plenty of non-background pixels
    browser.execute_script("document.getElementById('step-time').scrollIntoView()")
    assert browser.save_screenshot(shot)
    from PIL import Image
    img = Image.open(shot).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50
    background = max(colours)[0]
    assert 1 - background / (img.width * img.height) > 0.05
    assert img.getextrema() != ((255, 255),) * 3


@pytest.fixture(scope="module")
def report_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    out.write_text(make_report(G, fmt="html"))
    return out


def test_report_in_headless_chromium(browser, report_file, tmp_path):
    browser.set_window_size(1400, 1000)
    assert_report_renders(browser, str(report_file), str(tmp_path / "shot.png"), n_plans=10)


# every text matplotlib draws is a group named text_N (fonts drawn as paths; the report prefixes
# each chart's ids): its box on the page, and the box of its own <svg>
TEXT_BOXES = """
const out = [];
document.querySelectorAll('figure.chart').forEach(f => {
  const svg = f.querySelector('svg'), s = svg.getBoundingClientRect();
  svg.querySelectorAll('text, g[id]').forEach(t => {
    if (t.tagName === 'g' && !/-text_[0-9]+$/.test(t.id)) return;
    const r = t.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) return;
    out.push([f.dataset.chart + (f.dataset.plan ? ' #' + f.dataset.plan : '') + ' ' + t.id,
              r.left - s.left, s.right - r.right, r.top - s.top, s.bottom - r.bottom]);
  });
});
return out;"""


@pytest.mark.parametrize("width", [1400, 420], ids=["desktop", "narrow"])
def test_no_chart_text_is_clipped_and_charts_span_the_page(browser, report_file, width):
    browser.set_window_size(width, 1000)
    open_report(browser, str(report_file))
    boxes = browser.execute_script(TEXT_BOXES)
    assert len(boxes) > 500             # every chart's titles, legends, ticks and labels were found
    clipped = [b for b in boxes if min(b[1:]) < -0.5]     # a text crossing its chart's edge
    assert clipped == [], clipped[:5]
    # the page never scrolls sideways (a launch line in 'Run it' once made it 8,748 px wide)
    page = browser.execute_script("""let w = ['', 0];
        document.querySelectorAll('body *').forEach(e => { const r = e.getBoundingClientRect().right;
            if (r > w[1] && !e.closest('.scroll, figure')) w = [e.tagName + '.' + e.className, r]; });
        return [document.documentElement.scrollWidth, document.documentElement.clientWidth, w];""")
    assert page[0] <= page[1], page
    # each chart fills its figure; charts outside the two-up memory grid fill the section
    sizes = browser.execute_script("""
        return Array.from(document.querySelectorAll('figure.chart')).map(f => {
            const s = f.querySelector('svg').getBoundingClientRect(), sec = f.closest('section');
            const pad = parseFloat(getComputedStyle(sec).paddingLeft) + parseFloat(getComputedStyle(sec).paddingRight);
            return [f.dataset.chart, s.width, f.clientWidth, sec.clientWidth - pad, !!f.closest('.grid')]; });""")
    for kind, svg_w, fig_w, section_w, in_grid in sizes:
        assert svg_w >= min(fig_w, 480) - 1, (kind, svg_w, fig_w)   # 480 px: the least a chart is drawn at
        if width >= 1000 and not in_grid:
            assert svg_w >= 0.98 * section_w, (kind, svg_w, section_w)
