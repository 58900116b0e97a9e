"""The docs site's home page is the README (one text, never a copy): at build, `docs/index.md` is replaced by
README.md with its links into `docs/` made relative to the site (mkdocs.yml `hooks:`)."""

from __future__ import annotations

import re
from pathlib import Path

_INTO_DOCS = re.compile(r"\]\(docs/")


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != "index.md":
        return markdown
    readme = Path(config.config_file_path).parent / "README.md"
    return _INTO_DOCS.sub("](", readme.read_text())
