"""The dashboard in a real browser: headless Chromium driven by Playwright.

A driver program runs in another process: a ``get`` inside a loop (the advisor's
``get-in-loop``), then a slow trickle of tasks and a Dask graph held at its 10th task,
until the test opens its gates. The
dashboard is served from this process, reading the program's control socket. The test
uses the system Chromium (``make test`` installs it; nothing downloads browsers here)
and lets the page reach nothing but the dashboard: every other request is recorded and
refused, and there must be none.
"""

from __future__ import annotations

import re
import shutil

from tests import helpers
import pytest

from lightwork.dashboard.server import DashboardServer

pytestmark = pytest.mark.lightwork_only

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

DRIVER = """
import os, sys, time
import lightwork
from tests import support

lightwork.init(num_cpus=2)

@lightwork.remote
def step(i):
    time.sleep(0.02)
    return i

@lightwork.remote
def trickle(i):
    time.sleep(0.15)
    return i

def link(previous, i, release):  # a Dask chain that stops at link 9 until released
    deadline = time.monotonic() + 60
    while i == 9 and not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)
    return previous + 1

for i in range(12):  # a get inside the loop: the advisor's get-in-loop
    lightwork.get(step.remote(i))
print("SOCKET", support.control_path(), flush=True)
gate = sys.argv[1]

import threading, dask, lightwork.dask
chain = 0
for k in range(12):
    chain = dask.delayed(link)(chain, k, gate + ".dask")
graph = threading.Thread(target=lambda: chain.compute(scheduler=lightwork.dask.get))
graph.start()
i = 0
while not os.path.exists(gate):
    lightwork.get([trickle.remote(i), trickle.remote(i + 1)])
    i += 2
graph.join()
print("DONE", support.event_log().ended_states().get("FINISHED"), flush=True)
"""


@pytest.fixture
def browser_page():
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (make test installs it with apt-get as root)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install playwright)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 900})
        finally:
            browser.close()


def watch(page, origin: str) -> tuple[list[str], list[str]]:
    """The page's console and script errors, and every request it makes anywhere but
    ``origin`` (each aborted): the dashboard must work with no network."""
    errors: list[str] = []
    foreign: list[str] = []

    def route(route_request):
        url = route_request.request.url
        if url.startswith(origin):
            route_request.continue_()
        else:
            foreign.append(url)
            route_request.abort()

    page.on("console", lambda message: errors.append(message.text)
            if message.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.route("**/*", route)
    return errors, foreign


def test_the_page_shows_the_running_program(browser_page, tmp_path):
    page = browser_page
    info = helpers.start_session_driver(DRIVER)
    server = DashboardServer(info["socket"], port=0).start()
    errors, foreign = watch(page, f"http://127.0.0.1:{server.port}/")
    try:
        page.goto(server.url)
        assert "token=" not in page.url  # traded for the cookie
        page.wait_for_function("() => document.getElementById('liveness').textContent === 'live'")
        page.wait_for_function("() => document.getElementById('resources').textContent"
                               ".includes('CPU: ')")
        resources = page.inner_text("#resources")  # memory in bytes shows as bytes
        assert re.search(r"memory: [\d.]+ [kMGT]?B / [\d.]+ [kMGT]?B", resources), resources

        # A running Dask graph has its bar: 9 of its 12 tasks done, the 10th held.
        graph = page.locator(".progress-graph")
        graph.wait_for(timeout=20_000)
        page.wait_for_function("() => document.querySelector('.progress-graph').textContent"
                               ".includes('9 of 12 tasks done')", timeout=20_000)
        assert "Dask graph link" in graph.inner_text() and "1 running" in graph.inner_text()
        page.screenshot(path=str(tmp_path / "dashboard-progress.png"), full_page=True)
        open(info["gate"] + ".dask", "w").close()
        graph.wait_for(state="detached", timeout=20_000)  # it finished: no bar

        # Counts change as tasks finish.
        finished = page.locator(".count-FINISHED")
        finished.wait_for()
        first = int(finished.inner_text().replace(",", ""))
        page.wait_for_function(
            f"() => Number(document.querySelector('.count-FINISHED').textContent.replace(/,/g, '')) > {first}",
            timeout=15_000)

        # The advisor's finding for the get inside the loop, with its call site and fix.
        page.locator(".finding", has_text="get-in-loop").wait_for(timeout=15_000)
        card = page.locator(".finding", has_text="get-in-loop").first.inner_text()
        assert "driver.py" in card and "Fix:" in card

        # The task stream draws spans for tasks that ran, and hovering names one.
        page.click("#tabs button[data-view=stream]")
        page.wait_for_function("() => state.streamBoxes && state.streamBoxes.filter("
                               "b => b.y0 > 30).length > 3", timeout=15_000)
        box = page.evaluate("(() => { const b = state.streamBoxes.find(b => b.y0 > 30); "
                            "const r = document.getElementById('stream').getBoundingClientRect();"
                            " return {x: r.left + (b.x0 + b.x1) / 2, y: r.top + (b.y0 + b.y1) / 2};"
                            "})()")
        page.mouse.move(box["x"], box["y"])
        tooltip = page.locator("#tooltip")
        tooltip.wait_for(state="visible")
        assert "task" in tooltip.inner_text() and ("trickle" in tooltip.inner_text()
                                                   or "step" in tooltip.inner_text())
        assert page.evaluate("state.stream.driver.length") > 0  # the driver's staircase
        page.screenshot(path=str(tmp_path / "dashboard-stream.png"), full_page=True)

        # The tasks table: one page from the server, at most 100 rows in the DOM.
        page.click("#tabs button[data-view=tasks]")
        page.wait_for_function("() => document.querySelectorAll('#tasks tr').length > 5")
        assert page.locator("#tasks tr").count() <= 101
        page.select_option("#f-state", "FINISHED")
        page.wait_for_function("() => [...document.querySelectorAll('#tasks td:nth-child(3)')]"
                               ".every(td => td.textContent === 'FINISHED')")

        page.screenshot(path=str(tmp_path / "dashboard-tasks.png"), full_page=True)

        # A stack dump, read-only.
        page.click("#tabs button[data-view=stacks]")
        page.click("#stack-targets button[data-target=all]")
        page.wait_for_function("() => document.getElementById('stack-text').textContent"
                               ".includes('=== driver')", timeout=15_000)

        page.screenshot(path=str(tmp_path / "dashboard-stacks.png"))
        page.click("#tabs button[data-view=overview]")
        page.screenshot(path=str(tmp_path / "dashboard-overview.png"), full_page=True)

        # The program ends: the page says so and shows its final state, every task the
        # program ran (the last ones read as its session closed).
        open(info["gate"], "w").close()
        out, err = info["process"].communicate(timeout=30)
        assert "DONE" in out, err
        ran = int(out.split("DONE ")[1].split()[0])
        info = None
        page.locator("#banners .ended").wait_for(timeout=20_000)
        page.wait_for_function("() => document.querySelector('#banners .ended').textContent"
                               ".includes('read as it closed')", timeout=20_000)
        assert page.locator("#liveness").inner_text() == "ended"
        page.wait_for_function(
            f"() => Number(document.querySelector('.count-FINISHED').textContent"
            f".replace(/,/g, '')) === {ran}", timeout=10_000)
    finally:
        if info is not None:
            open(info["gate"] + ".dask", "w").close()
            helpers.stop_session_driver(info)
        server.stop()
    assert errors == []
    assert foreign == []


PROFILED = """
import os, sys, time
import lightwork
from tests import support

lightwork.init(num_cpus=2)

def busy_a(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

@lightwork.remote
def crunch():
    busy_a(0.05)

print("SOCKET", support.control_path(), flush=True)
gate = sys.argv[1]
while not os.path.exists(gate):
    lightwork.get([crunch.remote() for _ in range(4)])
lightwork.shutdown()
print("DONE", flush=True)
"""


def test_the_profile_view_samples_while_open(browser_page, tmp_path):
    from lightwork.kernel import control

    page = browser_page
    info = helpers.start_session_driver(PROFILED)
    server = DashboardServer(info["socket"], port=0).start()
    errors, foreign = watch(page, f"http://127.0.0.1:{server.port}/")
    try:
        page.goto(server.url + "#profile")
        page.wait_for_function("() => profile.samples > 0 && "
                               "[...document.querySelectorAll('#flame .frame')]"
                               ".some(f => f.textContent.startsWith('busy_a ('))",
                               timeout=30_000)
        options = page.eval_on_selector_all("#profile-pick option", "os => os.map(o => o.value)")
        assert options[0] == "all tasks" and "crunch" in options, options
        first = page.evaluate("profile.samples")
        page.wait_for_function(f"() => profile.samples > {first}", timeout=30_000)  # still going
        # One task function's tree; a click on a box zooms to it.
        page.select_option("#profile-pick", "crunch")
        page.locator("#flame .frame", has_text="busy_a").first.click()
        assert page.evaluate("profile.zoom")[-1].startswith("busy_a (")
        assert page.inner_text("#flame .frame >> nth=0").startswith("busy_a (")
        page.screenshot(path=str(tmp_path / "dashboard-profile.png"), full_page=True)
        # Left, the view stops asking: no profile stays on in the session.
        page.click("#tabs button[data-view=overview]")
        page.wait_for_function("() => !profile.running", timeout=15_000)
        control.request(info["socket"], "sample", {"seconds": 0.2}, timeout=15)
    finally:
        helpers.stop_session_driver(info)
        server.stop()
    assert errors == []
    assert foreign == []
