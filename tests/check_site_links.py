"""The built docs site works opened from disk (`file://.../site/index.html`): every relative
link of every page names a file that exists, never a directory (a browser shows a directory's
listing from disk, not its index.html). `make docs` runs it after `mkdocs build`."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

HREF = re.compile(r'\bhref="([^"]*)"')


def broken(site: Path) -> list[str]:
    found = []
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html":   # a web server's page, linked from the site's root
            continue
        for href in HREF.findall(page.read_text(errors="replace")):
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or not parts.path:   # elsewhere, or this page
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            if not target.is_file():
                found.append(f"{page.relative_to(site)}: {href} "
                             f"({'a directory' if target.is_dir() else 'missing'})")
    return found


if __name__ == "__main__":
    site = Path(sys.argv[1] if len(sys.argv) > 1 else "site")
    bad = broken(site)
    for line in bad[:20]:
        print(line, file=sys.stderr)
    if bad:
        sys.exit(f"{len(bad)} links of {site} do not open from disk (use_directory_urls: false "
                 "in mkdocs.yml?)")
    print(f"every relative link of {site} opens from disk")
