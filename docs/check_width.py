"""Does the built site read without scrolling sideways? Counts the boxes that scroll.

    python -m mkdocs build -d /tmp/site        # DOCS_EXECUTE_NOTEBOOKS=false: code cells only
    python docs/check_width.py /tmp/site [--width 1280] [--all]

For each notebook page (every page with ``--all``) it loads a copy of the page in
headless Chromium at the given window width, finds the boxes of the content that
scroll horizontally (``overflow-x: auto`` or ``scroll``), and prints how many of
them are wider than their column, with the longest line of each. Exit status 1 if
any is. Needs ``chromium`` on PATH (``apt-get install chromium``); not run in CI.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
import sys
from pathlib import Path

MEASURE = """<script>
window.addEventListener('load', () => {
  const wide = [];
  let boxes = 0;
  document.querySelectorAll('.md-content *').forEach(el => {
    const ox = getComputedStyle(el).overflowX;
    if (ox !== 'auto' && ox !== 'scroll') return;
    boxes += 1;
    if (el.scrollWidth > el.clientWidth + 1) {
      const lines = el.textContent.split('\\n');
      wide.push(lines.reduce((a, b) => a.length > b.length ? a : b).slice(0, 140));
    }
  });
  document.body.setAttribute('data-width-check', JSON.stringify({boxes, wide}));
});
</script>"""


def measure(page: Path, width: int) -> dict:
    """{"boxes": scrollable boxes, "wide": longest line of each that overflows}."""
    probe = page.with_name("_width_check.html")
    probe.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    try:
        dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                              f"--window-size={width},2000", "--virtual-time-budget=8000",
                              "--dump-dom", probe.as_uri()],
                             capture_output=True, text=True, timeout=120).stdout
    finally:
        probe.unlink()
    found = re.search(r'data-width-check="([^"]*)"', dom)
    if not found:
        raise RuntimeError(f"no measurement for {page} (is chromium installed?)")
    return json.loads(html.unescape(found.group(1)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built site (mkdocs build -d SITE)")
    parser.add_argument("--width", type=int, default=1280, help="window width in px")
    parser.add_argument("--all", action="store_true", help="every page, not only notebooks")
    args = parser.parse_args(argv)
    pattern = "**/index.html" if args.all else "notebooks/[0-9][0-9]_*/index.html"
    bad = 0
    for page in sorted(args.site.glob(pattern)):
        result = measure(page, args.width)
        name = page.parent.relative_to(args.site)
        print(f"{name}: {len(result['wide'])} of {result['boxes']} boxes scroll sideways")
        for line in result["wide"]:
            print(f"    {len(line):3d} chars: {line!r}")
        bad += len(result["wide"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
