"""Every page of the smoke book, opened in headless Chromium (driven by Playwright): no missing image, no broken
internal link (page or anchor), no Python traceback in an output cell, and an "Open in Colab" link on every notebook
page. Skipped, saying why, where Chromium or Playwright is missing (.ci/run installs Debian's chromium)."""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import threading
import time
import urllib.request
from urllib.parse import urldefrag, urljoin, urlparse

import pytest
from smoke_pipeline import smoke_book  # noqa: F401 (session fixture)

from diffeqformer import pipeline

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
COLAB = "https://colab.research.google.com/github/diffeqformer/diffeqformer/blob/main/notebooks/{}.ipynb"

pytestmark = [
    pytest.mark.pipeline,
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine: `apt-get install chromium` (.ci/run "
                                                "does it) to open the book in a browser"),
]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # the browser drops connections it no longer needs (broken pipes): not the book's fault


@pytest.fixture(scope="module")
def served_book(smoke_book):  # noqa: F811
    assert smoke_book.first.returncode == 0, smoke_book.first.explain()
    handler = functools.partial(_QuietHandler, directory=str(smoke_book.html))
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


_INSPECT = """() => ({
    url: location.href,
    ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    broken_images: Array.from(document.images)
        .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.currentSrc || i.src),
    outputs: Array.from(document.querySelectorAll('.cell_output, .output, .traceback')).map(e => e.innerText),
})"""


def _redirect_target(url: str) -> str | None:
    """The target of a page that is only a meta-refresh redirect, else None."""
    with urllib.request.urlopen(url, timeout=10) as r:
        head = r.read(4096).decode(errors="replace")
    m = re.search(r'<meta\s+http-equiv="refresh"\s+content="\d+;\s*url=([^"]+)"', head, flags=re.I)
    return urljoin(url, m[1].strip()) if m else None


def _inspect(page) -> dict:
    """What the checks need of the page (retried if the page navigates while it is read)."""
    for _ in range(5):
        try:
            page.wait_for_load_state("load")
            return page.evaluate(_INSPECT)
        except Exception as err:  # playwright.Error: the page navigated while being read
            if "context was destroyed" not in str(err) and "navigat" not in str(err):
                raise
    raise RuntimeError(f"{page.url} kept navigating")


def crawl(base: str) -> tuple[dict[str, list[str]], dict[str, dict]]:
    """Visit every page reachable from index.html; return the problems found per page and what each page holds."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
    problems: dict[str, list[str]] = {}
    pages: dict[str, dict] = {}
    queue, seen = [f"{base}/index.html"], set()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        # Offline: anything not served by the book's own server is answered with an abort, at once.
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base) else route.abort())
        bad_responses: list[str] = []
        page.on("response", lambda r: bad_responses.append(f"{r.status} {r.url}")
                if r.url.startswith(base) and r.status >= 400 and not r.url.endswith("favicon.ico") else None)
        page.on("requestfailed", lambda r: bad_responses.append(f"failed {r.url}") if r.url.startswith(base) else None)
        while queue:
            url = queue.pop()
            if url in seen:
                continue
            seen.add(url)
            redirect = _redirect_target(url)
            if redirect:  # index.html only sends the browser on to the root page
                pages[url], problems[url] = {"url": url, "ids": [], "links": [redirect]}, []
                queue.append(redirect)
                continue
            bad_responses.clear()
            response = page.goto(url, wait_until="load")
            found = []
            if response is None or response.status >= 400:
                found.append(f"page answered {response.status if response else 'nothing'}")
            info = _inspect(page)
            found += [f"image not loaded: {src}" for src in info["broken_images"]]
            found += [f"bad response: {r}" for r in bad_responses]
            found += ["Python traceback in an output cell: " + o[:300] for o in info["outputs"]
                      if "Traceback (most recent call last)" in o]
            problems[url] = found
            pages[url] = info
            for link in info["links"]:
                target, _ = urldefrag(link)
                if target.startswith(base) and urlparse(target).path.endswith(".html") and target not in seen:
                    queue.append(target)
        browser.close()
    # every internal link: its page was visited (and has the anchor), or its file (a download) is served
    files: dict[str, bool] = {}
    for url, info in pages.items():
        for link in info["links"]:
            target, fragment = urldefrag(link)
            if not target.startswith(base):
                continue
            if urlparse(target).path.endswith(".html") or target.rstrip("/") == base:
                if target not in pages:
                    problems[url].append(f"link to a page that was not found: {link}")
                elif fragment and fragment not in pages[target]["ids"]:
                    problems[url].append(f"broken anchor: {link}")
            else:
                if target not in files:
                    try:
                        with urllib.request.urlopen(target, timeout=10) as r:
                            files[target] = r.status == 200
                    except OSError:
                        files[target] = False
                if not files[target]:
                    problems[url].append(f"link to a file that is not served: {link}")
    return problems, pages


def test_every_page_renders_without_missing_images_broken_links_or_tracebacks(served_book):
    start = time.perf_counter()
    problems, pages = crawl(served_book)
    seconds = time.perf_counter() - start
    print(f"browser check: {len(pages)} pages in {seconds:.1f} s")
    names = {urlparse(u).path for u in pages}
    for nb in pipeline.PRESETS["smoke"]:
        assert f"/notebooks/{nb}.html" in names, f"notebook page {nb} not reachable from the index"
    assert {"/book/intro.html", "/book/reproducing.html", "/book/api.html"} <= names
    for url, info in pages.items():
        path = urlparse(url).path
        if path.startswith("/notebooks/"):
            name = path.rsplit("/", 1)[1].removesuffix(".html")
            assert COLAB.format(name) in info["links"], f"{path}: no Open-in-Colab link"
    bad = {u: p for u, p in problems.items() if p}
    assert not bad, "\n".join(f"{u}:\n  " + "\n  ".join(p) for u, p in bad.items())
