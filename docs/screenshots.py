"""Take the dashboard guide's screenshots: python docs/screenshots.py [--chromium PATH].

Runs a small program with a live dashboard (``init(dashboard=True)``), opens the page in
a headless Chromium through Playwright, and saves one PNG per view into docs/images/.
Not part of the tests: run it again when the dashboard's look changes, and commit the
images. It uses the system's Chromium (``executable_path``), so Playwright's own browser
download is not needed.
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time
from pathlib import Path

IMAGES = Path(__file__).resolve().parent / "images"
#: Each view, and the height of the page worth showing.
VIEWS = {"overview": 760, "stream": 260, "tasks": 860, "functions": 300, "actors": 200}


import lightwork as ray  # importing starts nothing: no thread, no process


@ray.remote
def resize(i: int) -> int:
    time.sleep(0.02 + (i % 7) * 0.01)
    return i


@ray.remote
def checksum(i: int) -> int:
    end = time.thread_time() + 0.03
    while time.thread_time() < end:
        pass
    return i


@ray.remote
class Aggregator:
    def __init__(self) -> None:
        self.total = 0

    def add(self, value: int) -> int:
        time.sleep(0.01)
        self.total += value
        return self.total


def workload(stop: threading.Event) -> None:
    aggregator = Aggregator.remote()
    round_ = 0
    while not stop.is_set():
        refs = [resize.remote(i) for i in range(40)] + [checksum.remote(i) for i in range(20)]
        for value in ray.get(refs[:5]):
            aggregator.add.remote(value)
        if round_ % 3 == 0:
            for i in range(4):  # a get in a loop, for the advisor's box
                ray.get(resize.remote(i))
        ray.get(refs)
        round_ += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    context = ray.init(num_cpus=2, dashboard=True)
    stop = threading.Event()
    thread = threading.Thread(target=workload, args=(stop,), daemon=True)
    thread.start()
    time.sleep(4)  # a few seconds of history for the charts
    IMAGES.mkdir(exist_ok=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=args.chromium,
                headless=True,
                args=["--no-sandbox", "--disable-background-networking"],
            )
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.goto(context["dashboard_url"])
            page.wait_for_timeout(3000)
            for view, height in VIEWS.items():
                page.click(f'[data-view="{view}"]')
                page.wait_for_timeout(2500)
                page.screenshot(
                    path=str(IMAGES / f"dashboard-{view}.png"),
                    clip={"x": 0, "y": 0, "width": 1280, "height": height},
                )
                print(f"wrote docs/images/dashboard-{view}.png")
            browser.close()
    finally:
        stop.set()
        thread.join(timeout=10)
        ray.shutdown()


if __name__ == "__main__":
    main()
