"""``/dashboard`` in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by Selenium, reading the page's DOM while OpenAI clients
stream chats at the server.

The server runs the tiny random model on a small arena (48 pages of 16 tokens), so
a batch of chats fills it, preempts and, when a second batch with another system
prompt arrives, evicts the first batch's cached pages. What a viewer relies on, read
from the page: pages in use rise while chats run and fall to zero after; the
shared system prompt is pages read by several requests at once (ref count > 1);
evictions show; with ``--api-key`` the page asks for the key, then works.

Without Chromium these tests fail (they never skip) and say how to install it.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from server_helpers import TINY_NAME, make_llm, tiny

from paged_np.server import ServerThread

INSTALL = "apt-get install chromium chromium-driver"
CHROME_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", "--window-size=1600,1000"]
SYSTEM = ("You are a patient teacher. Explain how a paged KV cache stores keys and values "
          "in fixed-size pages, and answer briefly.")

# Everything the tests read from the page, in one round trip.
READ_DOM = """
if (!document.getElementById('status'))       // another page (the server's key form)
  return {status: 'not the dashboard', cells: [], in_use: -1, cached: -1, max_ref: -1,
          evictions: -1, step: -1};
const n = (id) => Number(document.getElementById(id).textContent);
const cells = [...document.querySelectorAll('#arena .page')];
return {in_use: n('pages-in-use'), cached: n('pages-cached'), max_ref: n('max-ref-count'),
        evictions: n('evictions'), step: n('step'),
        status: document.getElementById('status').dataset.status,
        cells: cells.map((c) => [c.dataset.state, Number(c.dataset.ref), c.dataset.owner])};
"""


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", chromium), ("chromedriver", driver))
               if path is None]
    if missing:
        pytest.fail(f"the dashboard's browser test needs {' and '.join(missing)} on PATH: "
                    f"{INSTALL}", pytrace=False)
    return chromium, driver


@pytest.fixture(scope="module")
def browser():
    chromium, driver_path = _browser_paths()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail('the dashboard\'s browser test needs selenium: pip install -e ".[dev]"',
                    pytrace=False)
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="paged_np-chromium-")
    for arg in CHROME_ARGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.set_script_timeout(10)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny()


def _wait(driver, pred, timeout=20.0, what="the page"):
    """Read the DOM every 50 ms until ``pred(dom)``; fail with the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        dom = driver.execute_script(READ_DOM)
        if pred(dom):
            return dom
        if time.monotonic() > deadline:
            dom.pop("cells")
            pytest.fail(f"{what} did not happen within {timeout} s; the page shows {dom}")
        time.sleep(0.05)


def _chat(client, system, user, max_tokens):
    stream = client.chat.completions.create(
        model=TINY_NAME, stream=True, max_tokens=max_tokens, temperature=0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        extra_body={"ignore_eos": True})
    return sum(1 for c in stream if c.choices and c.choices[0].delta.content)


def _watch_batch(driver, client, system, n, max_tokens):
    """Run ``n`` chats at once; read the page until they finish. Returns every reading."""
    readings = []
    with ThreadPoolExecutor(n) as pool:
        futs = [pool.submit(_chat, client, system, f"Question {i}: why pages?", max_tokens)
                for i in range(n)]
        while not all(f.done() for f in futs):
            readings.append(driver.execute_script(READ_DOM))
            time.sleep(0.05)
        for f in futs:
            f.result()                                  # a failed chat fails the test
    return readings


def test_dashboard_follows_the_cache(browser, tiny_pair):
    model, tok = tiny_pair
    llm = make_llm(model, tok, num_pages=48, max_num_seqs=8)
    with ServerThread(llm) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                               timeout=120)
        browser.get(srv.url + "/dashboard")
        dom = _wait(browser, lambda d: d["status"] == "live" and len(d["cells"]) == 48,
                    what="the stream opening")
        assert dom["in_use"] == 0 and dom["max_ref"] == 0
        assert all(c[0] == "free" for c in dom["cells"])

        # Eight chats with one system prompt: more than the arena holds at once.
        t0 = time.monotonic()
        readings = _watch_batch(browser, client, SYSTEM, 8, 160)
        t_batch = time.monotonic() - t0
        assert len(readings) >= 5, f"the batch ran {t_batch:.1f} s: too fast to watch"
        peak = max(r["in_use"] for r in readings)
        assert peak > 0, "pages in use never rose while the chats ran"
        # The system prompt's full pages are read by several requests at once: cells in
        # use with a ref count > 1, and the summary says so.
        shared = [r for r in readings if r["max_ref"] > 1
                  and any(s == "in_use" and ref > 1 for s, ref, _ in r["cells"])]
        assert shared, "no page was ever shown shared (ref count > 1) while the chats ran"
        owners = {o for r in readings for s, _, o in r["cells"] if s == "in_use"}
        assert len(owners) >= 2, f"pages in use were never coloured by request: {owners}"
        # Each reading's summary agrees with its cells.
        for r in readings:
            assert r["in_use"] == sum(s == "in_use" for s, _, _ in r["cells"])

        dom = _wait(browser, lambda d: d["in_use"] == 0, what="pages in use falling to zero")
        assert dom["cached"] > 0                        # finished chats leave their pages cached
        cached_before = {i for i, c in enumerate(dom["cells"]) if c[0] == "cached"}

        # Another system prompt: its pages must come from the cached ones (nothing is free
        # for long in 48 pages), so the page shows evictions and cached cells taken over.
        readings = _watch_batch(browser, client, "Another teacher, another prompt: " * 3, 8, 160)
        dom = _wait(browser, lambda d: d["in_use"] == 0 and d["evictions"] > 0,
                    what="an eviction showing")
        retaken = {i for r in readings for i, (s, _, o) in enumerate(r["cells"])
                   if i in cached_before and s == "in_use" and o}
        assert retaken, "no cached page was shown taken over by a new request"
        assert dom["evictions"] == llm.engine.stats()["evictions"]
        print(f"first batch {t_batch:.1f} s, {len(readings)} readings of the second, "
              f"peak {peak} pages in use, {dom['evictions']} evictions")


def _enter_key(driver, key):
    """Type ``key`` into the page's key form (the server's ask page or the dashboard's own)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    deadline = time.monotonic() + 20
    while True:
        boxes = [b for b in driver.find_elements(By.CSS_SELECTOR, "input[type=password]")
                 if b.is_displayed()]
        if boxes:
            break
        if time.monotonic() > deadline:
            pytest.fail("the dashboard never asked for the API key")
        time.sleep(0.05)
    boxes[0].clear()
    boxes[0].send_keys(key, Keys.ENTER)


def test_dashboard_asks_for_the_api_key(browser, tiny_pair):
    model, tok = tiny_pair
    with ServerThread(make_llm(model, tok, num_pages=32), api_key="sesame") as srv:
        assert httpx.get(srv.url + "/v1/cache", timeout=10).status_code == 401
        browser.get(srv.url + "/dashboard")
        _enter_key(browser, "wrong")
        time.sleep(0.5)
        _enter_key(browser, "sesame")                    # a wrong key: it asks again
        _wait(browser, lambda d: d["status"] == "live" and len(d["cells"]) == 32,
              what="the stream opening with the key")
        assert "sesame" not in browser.current_url       # the key left the address bar
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="sesame", max_retries=0,
                               timeout=60)
        _chat(client, SYSTEM, "hello", 8)
        _wait(browser, lambda d: d["in_use"] == 0 and d["cached"] > 0,
              what="the chat's pages showing as cached")


def test_dashboard_is_in_the_package():
    """The page's files ship with the package, and /dashboard serves them as one page."""
    from importlib import resources

    static = resources.files("paged_np.server").joinpath("static")
    for name in ("dashboard.html", "dashboard.css", "dashboard.js"):
        assert static.joinpath(name).is_file(), name
    from paged_np.server.dashboard import dashboard_html

    html = dashboard_html()
    assert "<script src=" not in html and "<link rel=\"stylesheet\"" not in html
    assert "http://" not in html and "https://" not in html    # nothing from outside
