"""A mkdocs hook (mkdocs.yml's `hooks`): the title of every listing links to the file it names.

With `repo_url` set in mkdocs.yml a title links to its file in the repository
(`<repo_url>/blob/main/<path>`). Without one the site carries the files itself: each file a
listing names becomes a page `source/<path>/` that shows the whole file (included at build time,
like every listing), and the title links there. The project names no public repository yet, so
that is what the site does today.
"""

import re
from pathlib import Path

from mkdocs.structure.files import File
from mkdocs.utils import get_relative_url

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "source"
TITLE = re.compile(r'^[ \t]*```\w*[ \t]+title="([^"]+)"', re.MULTILINE)
FILENAME = re.compile(r'<span class="filename">([^<]+)</span>')
LANGUAGES = {".py": "python", ".json": "json"}


def listed_files(docs_dir: str) -> list[str]:
    """Every file a listing's title names, over all pages."""
    pages = Path(docs_dir).glob("*.md")
    return sorted({match.group(1) for page in pages for match in TITLE.finditer(page.read_text())})


def on_files(files, config):
    if config.repo_url:
        return files
    for path in listed_files(config.docs_dir):
        if (ROOT / path).is_file():
            language = LANGUAGES.get(Path(path).suffix, "text")
            content = f'# {path}\n\n```{language} title="{path}" linenums="1"\n--8<-- "{path}"\n```\n'
            files.append(File.generated(config, f"{SOURCE}/{path}.md", content=content))
    return files


def on_page_content(html, page, config, files):
    if page.file.src_uri.startswith(f"{SOURCE}/"):
        return html

    def link(match):
        path = match.group(1)
        if config.repo_url:
            href = f"{config.repo_url.rstrip('/')}/blob/main/{path}"
        else:
            target = files.get_file_from_path(f"{SOURCE}/{path}.md")
            if target is None:
                return match.group(0)
            href = get_relative_url(target.url, page.url)
        return f'<span class="filename"><a href="{href}">{path}</a></span>'

    return FILENAME.sub(link, html)
