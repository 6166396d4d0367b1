"""The documentation site works opened from disk (``file://``), as the README says: built as ``make docs``
builds it, every link between its pages names a file that exists (no folder URLs, which a browser shows
as a folder listing under ``file://``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_every_page_link_is_a_file_on_disk(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")  # a server's page, not browsed
    assert len(pages) > 20
    checked = 0
    for page in pages:
        for href in re.findall(r'href="([^"]+)"', page.read_text(encoding="utf-8")):
            parts = urlsplit(href)
            if parts.scheme or href.startswith(("#", "//", "mailto:")) or not parts.path:
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            assert target.is_file(), f"{page.relative_to(site)}: link {href} is not a file under file://"
            checked += 1
    assert checked > 500  # the navigation of every page, at least
