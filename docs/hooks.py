"""MkDocs hooks: pages built from the repository itself, so the site cannot drift.

- ``notebooks/*.ipynb`` appear as ``notebooks/<name>.ipynb`` (mkdocs-jupyter runs
  them at build time; the stored notebooks carry no outputs);
- ``benchmarks/*.png`` appear as ``benchmarks/<name>.png``, next to the
  benchmark pages that include ``benchmarks/*.md`` with snippets, so the
  figures those files link to resolve;
- ``img/walkthrough.png`` is drawn by ``paged_np.cli.walkthrough.run`` at build
  time (the same tour as ``python -m paged_np walkthrough``);
- ``<!-- bench-machine -->`` in a page becomes a table of the machine recorded
  in ``benchmarks/results.json``.

Listed in ``mkdocs.yml`` under ``hooks:`` and left out of the site with
``exclude_docs``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # import this checkout's paged_np even when not installed
    sys.path.insert(0, str(ROOT))

_TMP = tempfile.TemporaryDirectory(prefix="paged_np_docs_")


def on_config(config):
    # The notebook kernels that mkdocs-jupyter starts inherit this environment:
    # import this checkout's paged_np and the notebooks' exercise checker
    # (notebooks/_exercise.py), and keep Jupyter's inline matplotlib backend (an
    # inherited MPLBACKEND=Agg would hide every figure).
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [str(ROOT), str(ROOT / "notebooks")] + inherited
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    os.environ.pop("MPLBACKEND", None)
    return config


def _draw_walkthrough() -> Path:
    from paged_np.cli import walkthrough

    out = Path(_TMP.name) / "walkthrough.png"
    walkthrough.run(str(out), quiet=True)
    return out


@event_priority(100)  # before mkdocs-jupyter wraps the .ipynb files
def on_files(files, config):
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        # A real File rooted at the repository (src_uri "notebooks/<name>"), not a
        # generated one: mkdocs-jupyter's wrapper needs src_dir to find the source.
        files.append(File(f"notebooks/{nb.name}", src_dir=str(ROOT), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    for png in sorted((ROOT / "benchmarks").glob("*.png")):
        files.append(File.generated(config, f"benchmarks/{png.name}", abs_src_path=str(png)))
    files.append(File.generated(config, "img/walkthrough.png",
                                abs_src_path=str(_draw_walkthrough())))
    return files


def _machine_table() -> str:
    path = ROOT / "benchmarks" / "results.json"
    data = json.loads(path.read_text())
    machine = dict(data.get("machine", {}))
    if "bandwidth_gbs" in data:
        machine["streaming read bandwidth"] = f"{data['bandwidth_gbs']:.1f} GB/s"
    rows = "\n".join(f"| {k} | {v} |" for k, v in machine.items())
    return f"| machine (from `benchmarks/results.json`) | |\n|---|---|\n{rows}\n"


def on_page_markdown(markdown, page, config, files):
    if "<!-- bench-machine -->" in markdown:
        markdown = markdown.replace("<!-- bench-machine -->", _machine_table())
    return markdown
