"""Every page of the smoke book, opened in headless Chromium (driven by Playwright) with nothing reachable but the
book's own server: no missing or broken image, no broken internal link (page or anchor), no Python traceback in an
output cell, no request that leaves the book, every formula typeset (none left as raw TeX), and on every notebook
page an "Open in Colab" link, at least as many images as the notebook saved figures (each followed by its caption),
no figure printed as its text (``<Figure size ...>``), no Colab cell and no code shown open; a page with
headline claims opens with their verdicts in the verdicts page's words, and calls nothing reproduced elsewhere; no
table is wider than the text column, no table cell says "nan" and no printed output (a log) is shown. A
full-page screenshot of every page goes to ``_build/screenshots/`` (the test prints where). Skipped, saying why,
where Chromium or Playwright is missing (.ci/run installs Debian's chromium)."""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import re
import shutil
import threading
import time
import urllib.request
from urllib.parse import urldefrag, urljoin, urlparse

import pytest
from smoke_pipeline import smoke_book  # noqa: F401 (session fixture)

from diffeqformer import paths
from diffeqformer.workflow.presets import presets
from diffeqformer.analysis import claims
from diffeqformer.report import book
from diffeqformer.report.words import statistics as wording

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
SCREENSHOTS = paths.REPO / "_build" / "screenshots"

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


# MathJax typesets after the page has loaded: wait for it (at most 20 s), then read the page.
_INSPECT = r"""async () => {
    const mj = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
    if (mj) await Promise.race([mj, new Promise(r => setTimeout(r, 20000))]);
    const column = () => {  // the text column's width: the article's inside its padding
        const a = document.querySelector('article.bd-article'), style = getComputedStyle(a);
        return a.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    };
    const raw_tex = [];  // TeX delimiters in text a reader sees (code blocks and typeset math aside)
    const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    while (walk.nextNode()) {
        const node = walk.currentNode;
        if (node.parentElement.closest('pre, code, script, style, textarea, mjx-container')) continue;
        if (/\\\(|\\\[|\$\$/.test(node.nodeValue)) raw_tex.push(node.nodeValue.trim().slice(0, 120));
    }
    // a figure printed as its text, anywhere but in prose that quotes it as code (the API reference does)
    const copy = document.body.cloneNode(true);
    copy.querySelectorAll('code.literal, script, style').forEach(e => e.remove());
    const figure_reprs = copy.textContent.match(/<Figure size [^>]*>/g) || [];
    const verdict = document.getElementById('what-it-shows');
    const opening = document.querySelector('article.bd-article div.admonition.verdict');
    const outside = document.querySelector('article.bd-article').cloneNode(true);
    outside.querySelectorAll('div.admonition.verdict').forEach(e => e.remove());
    const images = Array.from(document.querySelectorAll('.cell_output img'));
    return {
        url: location.href,
        ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
        links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
        broken_images: Array.from(document.images)
            .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.currentSrc || i.src),
        outputs: Array.from(document.querySelectorAll('.cell_output, .output, .traceback')).map(e => e.innerText),
        images: images.length,
        images_after_verdict: verdict ? images.filter(
            i => verdict.compareDocumentPosition(i) & Node.DOCUMENT_POSITION_FOLLOWING).length : 0,
        // a caption is a paragraph of an output that starts with its figure's name in bold
        // (an image shown smaller than its file is a link to the file: <a><img></a>)
        captions: Array.from(document.querySelectorAll('.cell_output p > strong:first-child')).map(b => {
            const before = b.parentElement.previousElementSibling;
            return {name: b.innerText.replace(/\.$/, ''),
                    after_image: !!before && (before.matches('img') || !!before.querySelector(':scope > img'))};
        }),
        figure_reprs: figure_reprs,
        colab_cell: document.body.textContent.includes('google.colab'),
        open_code: Array.from(document.querySelectorAll('.cell_input'))
            .filter(e => e.checkVisibility()).map(e => e.innerText.slice(0, 80)),
        // what follows the title (and the verdict that opens a page with claims): the page's figure (an output
        // holding an image), or on an exploratory page the sentence that says so
        first_after_title: (() => {
            const h1 = document.querySelector('article.bd-article h1');
            let next = h1 && h1.nextElementSibling;
            if (next && next === opening) next = next.nextElementSibling;
            // code cells that show nothing (their source behind its toggle, no output) are not what the reader sees
            const shows = e => !!e.querySelector('img') ||
                Array.from(e.querySelectorAll('.cell_output')).some(o => o.innerText.trim());
            while (next && next.classList.contains('cell') && !shows(next)) next = next.nextElementSibling;
            return next ? {tag: next.tagName.toLowerCase(), text: next.innerText.trim(),
                           image: !!next.querySelector('img')} : null;
        })(),
        opening: opening ? {text: opening.innerText,
                            follows_title: opening.previousElementSibling ===
                                document.querySelector('article.bd-article h1'),
                            items: Array.from(opening.querySelectorAll('li')).map(li => ({
                                claim: (li.querySelector('em') || {innerText: ''}).innerText,
                                word: (li.querySelector('strong') || {innerText: ''}).innerText}))} : null,
        outside_opening: outside.innerText,
        // a log, or the value a cell ended with shown as plain text
        printed: Array.from(document.querySelectorAll(
            '.cell_output .output.stream, .cell_output .output.stderr, .cell_output .output.text_plain'))
            .map(e => e.innerText.slice(0, 80)),
        nan_cells: Array.from(document.querySelectorAll('article.bd-article td')).map(td => td.innerText)
            .filter(t => /\bnan\b/i.test(t)),
        // tables wider than the text column (those in a collapsed block aside): cut off or scrolled sideways
        // (the column: the article's width inside its padding, which a table scrolled in its output box exceeds)
        wide_tables: Array.from(document.querySelectorAll('article.bd-article table'))
            .filter(t => !t.closest('details:not([open])'))
            .filter(t => t.getBoundingClientRect().width > column() + 1)
            .map(t => t.innerText.replace(/\s+/g, ' ').slice(0, 60) + ` (${t.scrollWidth} px of ${column()})`),
        // each table row's cells: the bold word of a cell where it has one, else its text
        verdict_rows: Array.from(document.querySelectorAll('table tbody tr')).map(
            tr => Array.from(tr.querySelectorAll('td')).map(
                td => (td.querySelector('strong') || td).innerText.trim())),
        math: document.querySelectorAll('.math').length,
        typeset: document.querySelectorAll('mjx-container').length,
        typeset_in_text: document.querySelectorAll('article.bd-article mjx-container').length,
        raw_tex: raw_tex,
    };
}"""


def _redirect_target(url: str) -> str | None:
    """The target of a page that is only a meta-refresh redirect, else None."""
    with urllib.request.urlopen(url, timeout=10) as r:
        head = r.read(4096).decode(errors="replace")
    m = re.search(r'<meta\s+http-equiv="refresh"\s+content="\d+;\s*url=([^"]+)"', head, flags=re.I)
    return urljoin(url, m[1].strip()) if m else None


async def _inspect(page) -> dict:
    """What the checks need of the page (retried if the page navigates while it is read)."""
    for _ in range(5):
        try:
            await page.wait_for_load_state("load")
            return await page.evaluate(_INSPECT)
        except Exception as err:  # playwright.Error: the page navigated while being read
            if "context was destroyed" not in str(err) and "navigat" not in str(err):
                raise
    raise RuntimeError(f"{page.url} kept navigating")


SHOT_HEIGHT = 16000
"""Pixels of page per screenshot file: Chromium leaves most of a taller full-page screenshot blank (the API page is
190,000 pixels tall), so a longer page is saved in parts, ``<page>-1.png``, ``<page>-2.png``, ..."""


async def _screenshot(page, folder, url: str) -> None:
    """A full-page screenshot of the page at ``url``, in ``folder`` (``notebooks__f2_spectra.png``). A page taller
    than ``SHOT_HEIGHT`` is shot part by part through a window that tall, scrolled down a part at a time (the last
    part is the page's bottom), as a reader with a very tall screen would see it: a full-page shot clipped to each
    part laid the whole page out again for every part (the API page: 41 s, against 19 s so)."""
    name = urlparse(url).path.strip("/").removesuffix(".html").replace("/", "__")
    height = await page.evaluate("document.documentElement.scrollHeight")
    if height <= SHOT_HEIGHT:
        await page.screenshot(path=str(folder / f"{name}.png"), full_page=True)
        return
    viewport = page.viewport_size
    await page.set_viewport_size({"width": viewport["width"], "height": SHOT_HEIGHT})
    try:
        for i, top in enumerate(range(0, height, SHOT_HEIGHT), start=1):
            await page.evaluate(f"window.scrollTo(0, {top})")
            await page.screenshot(path=str(folder / f"{name}-{i}.png"))
    finally:
        await page.set_viewport_size(viewport)


TABS = 2
"""Pages visited at once, each in a browser of its own: the API page's screenshots (a third of the time) are taken
while the other browser visits the other pages. On two cores Chromium keeps both busy with one page already: 23 pages
in 54.1 s with two, 58.5 s with one (2026-11-28)."""


def crawl(base: str, screenshots=None, tabs: int = TABS) -> tuple[dict[str, list[str]], dict[str, dict]]:
    """Visit every page reachable from index.html, ``tabs`` at a time; return the problems found per page and what
    each page holds. With ``screenshots`` (a folder), save a full-page screenshot of every page there."""
    pytest.importorskip("playwright.async_api", reason="Playwright is not installed (pip install playwright)")
    problems: dict[str, list[str]] = {}
    pages: dict[str, dict] = {}
    asyncio.run(_visit_all(base, screenshots, tabs, problems, pages))
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


async def _visit_all(base: str, screenshots, tabs: int, problems: dict, pages: dict) -> None:
    """``crawl``'s visits: ``tabs`` browsers take the next page to visit from one queue until none finds another."""
    from playwright.async_api import async_playwright

    queue: asyncio.Queue[str] = asyncio.Queue()
    seen: set[str] = set()

    def enqueue(url: str) -> None:
        if url not in seen:
            seen.add(url)
            queue.put_nowait(url)

    async def tab(playwright) -> None:
        # a browser of its own: Chromium takes a tab's screenshots in its browser process, one at a time
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = await browser.new_page()
            # Offline: anything not served by the book's own server is answered with an abort, at once.
            await page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                             else route.abort())
            bad_responses: list[str] = []
            outside: list[str] = []
            page.on("request", lambda r: outside.append(r.url)
                    if not r.url.startswith((base, "data:", "blob:", "about:")) else None)
            page.on("response", lambda r: bad_responses.append(f"{r.status} {r.url}")
                    if r.url.startswith(base) and r.status >= 400 and not r.url.endswith("favicon.ico") else None)
            page.on("requestfailed", lambda r: bad_responses.append(f"failed {r.url}")
                    if r.url.startswith(base) else None)
            while True:
                url = await queue.get()
                try:
                    redirect = await asyncio.to_thread(_redirect_target, url)
                    if redirect:  # index.html only sends the browser on to the root page
                        pages[url], problems[url] = {"url": url, "ids": [], "links": [redirect]}, []
                        enqueue(redirect)
                        continue
                    bad_responses.clear()
                    outside.clear()
                    response = await page.goto(url, wait_until="load")
                    problems[url] = [] if response is not None and response.status < 400 else [
                        f"page answered {response.status if response else 'nothing'}"]
                    pages[url] = info = await _inspect(page)
                    problems[url] += _problems(info, bad_responses, outside)
                    if screenshots is not None:
                        await _screenshot(page, screenshots, url)
                    for link in info["links"]:
                        target, _ = urldefrag(link)
                        if target.startswith(base) and urlparse(target).path.endswith(".html"):
                            enqueue(target)
                finally:
                    queue.task_done()
        finally:
            await browser.close()

    async with async_playwright() as playwright:
        enqueue(f"{base}/index.html")
        workers = [asyncio.create_task(tab(playwright)) for _ in range(tabs)]
        finished = asyncio.create_task(queue.join())
        # a tab that fails ends the crawl with its error (else the queue would wait for it for ever)
        done, _ = await asyncio.wait([finished, *workers], return_when=asyncio.FIRST_COMPLETED)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for task in done:
            task.result()  # raises a tab's error


def _problems(info: dict, bad_responses: list[str], outside: list[str]) -> list[str]:
    """What is wrong with a page, from what ``_INSPECT`` read of it and the requests it made."""
    found = [f"image not loaded: {src}" for src in info["broken_images"]]
    found += [f"bad response: {r}" for r in bad_responses]
    found += [f"request outside the book (it must read offline): {r}" for r in dict.fromkeys(outside)]
    if info["math"] and info["typeset"] < info["math"]:
        found.append(f"{info['math'] - info['typeset']} of {info['math']} formulas not typeset")
    found += [f"raw TeX in the text: {t!r}" for t in info["raw_tex"]]
    found += [f"a figure printed as text instead of an image: {r}" for r in info["figure_reprs"]]
    found += ["Python traceback in an output cell: " + o[:300] for o in info["outputs"]
              if "Traceback (most recent call last)" in o]
    return found


def saved_figures(figures_dir) -> dict[str, list[str]]:
    """notebook -> the figures (not tables) it saved, from the provenance records beside them."""
    out: dict[str, list[str]] = {}
    for path in sorted(figures_dir.glob("*.json")):
        record = json.loads(path.read_text())
        if any(f.endswith(".png") for f in record["files"]):
            out.setdefault(record["notebook"], []).append(record["figure"])
    return out


def _plain(text: str) -> str:
    """Text as written in the source: Sphinx prints an apostrophe as a typographic one."""
    return text.replace("\u2019", "'").replace("\u2018", "'")


def verdicts_page(info: dict) -> dict[str, str]:
    """The Verdicts page's word for each headline claim (its paper text -> the word of the preset's column)."""
    words = {}
    for row in info["verdict_rows"]:
        for claim in claims.CLAIMS.values():
            if len(row) >= 3 and _plain(row[0]).endswith(f": {claim.paper}"):
                words[claim.paper] = row[2]
    assert len(words) == len(claims.CLAIMS), f"the verdicts page has rows for {sorted(words)}"
    return words


STRONG = re.compile(r"as the paper reports|\breproduced\b|\bcontradicted\b", flags=re.I)
"""What a page may say of a claim only in its opening, which says what the verdicts page says: a verdict's word
(the prose quotes what a test found, before Holm's adjustment, in other words)."""


def _verdict_problems(name: str, info: dict, headline: dict[str, str]) -> list[str]:
    """A page with headline claims opens with them, under its title, with the verdicts page's words, none with
    "nan"; outside that opening it calls nothing reproduced (the rule's own words aside)."""
    mine = [c for c in claims.CLAIMS.values() if c.notebook == name]
    opening = info["opening"]
    if not mine:
        return ["a verdict opens a page without a headline claim"] if opening else []
    if not opening:
        return ["no verdict opens the page"]
    found = [] if opening["follows_title"] else ["the verdict does not follow the title"]
    items = {_plain(i["claim"]): i["word"] for i in opening["items"]}
    found += [f"the page's verdict on {c.paper!r} is {items.get(c.paper)!r}, the verdicts page's "
              f"{headline[c.paper]!r}" for c in mine if items.get(c.paper) != headline[c.paper]]
    if re.search(r"\bnan\b", opening["text"], flags=re.I):
        found.append("'nan' in the page's verdict")
    text = " ".join(info["outside_opening"].split()).replace(" ".join(wording.RULE.split()), "")
    found += [f"outside its verdict the page says {m[0]!r}: ...{text[max(0, m.start() - 80):m.end() + 40]}..."
              for m in STRONG.finditer(text)]
    return found


def test_every_page_as_a_reader_sees_it(served_book, smoke_book):  # noqa: F811
    """The checks of the module docstring on every page; prints images per notebook page against the figures the
    notebook saved (from the provenance records)."""
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)
    start = time.perf_counter()
    problems, pages = crawl(served_book, SCREENSHOTS)
    seconds = time.perf_counter() - start
    print(f"browser check: {len(pages)} pages in {seconds:.1f} s; full-page screenshots of each in {SCREENSHOTS}")
    names = {urlparse(u).path for u in pages}
    for nb in presets()["smoke"]:
        assert f"/notebooks/{nb}.html" in names, f"notebook page {nb} not reachable from the index"
    assert {"/book/intro.html", "/book/reproducing.html", "/book/api.html"} <= names

    headline = verdicts_page(pages[f"{served_book}/book/verdicts.html"])
    figures = saved_figures(smoke_book.home / "figures")
    assert figures.get("f2_spectra"), "F2 saved no figure: the check below would prove nothing"
    print(f"{'page':42s} {'images':>6s} {'figures saved':>13s}")
    for url, info in sorted(pages.items()):
        path = urlparse(url).path
        if not path.startswith("/notebooks/"):
            continue
        name = path.rsplit("/", 1)[1].removesuffix(".html")
        saved = figures.get(name, [])
        print(f"{path:42s} {info['images']:6d} {len(saved):13d}")
        found = problems[url]
        if book.colab_link(name) not in info["links"]:
            found.append("no Open-in-Colab link")
        if info["images"] < len(saved):
            found.append(f"{info['images']} images for the {len(saved)} figures the notebook saved")
        captioned = {c["name"] for c in info["captions"] if c["after_image"]}
        found += [f"figure {f} is not an image followed by its caption" for f in saved if f not in captioned]
        if info["colab_cell"]:
            found.append("the Colab cell is on the page")
        found += [f"code shown open: {c!r}" for c in info["open_code"]]
        found += _verdict_problems(name, info, headline)
        found += [f"a table wider than the text column: {t}" for t in info["wide_tables"]]
        found += [f"'nan' in a table cell: {t!r}" for t in info["nan_cells"]]
        found += [f"printed output (a log) on the page: {t!r}" for t in info["printed"]]
        first = info["first_after_title"] or {"tag": "nothing", "text": ""}
        if not (first.get("image") or first["text"].startswith("Exploratory")):
            found.append(f"the title is followed by <{first['tag']}> {first['text'][:80]!r}, not by the page's "
                         f"figure or the word that it is exploratory")
        if info["images_after_verdict"]:
            found.append(f"{info['images_after_verdict']} images after the verdict ('What it shows')")
        if name == "f2_spectra" and not info["typeset_in_text"]:
            found.append("no typeset formula in the text, whose introduction has formulas")
    bad = {u: p for u, p in problems.items() if p}
    assert not bad, "\n".join(f"{u}:\n  " + "\n  ".join(p) for u, p in bad.items())
