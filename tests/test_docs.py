"""The docs site: every include resolves, every image exists, the generated files are what the
scripts make now, and `mkdocs build --strict` passes, with every listing's title linked; the
runnable examples (docs/examples/) run; the API page's classes document every argument; the
measurement log (perf/LOG.md) is dated and cites results that exist.

Pages are docs/*.md; they include source through pymdownx.snippets lines (`--8<-- "path"`,
`"path:section"` between `# --8<-- [start:section]` / `[end:section]` comments, or
`"path:first:last"`), and generated files from docs/generated/, whose images are relative to
docs/ like the pages that include them.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
INCLUDE = re.compile(r'^[ \t]*-+8<-+[ \t]+"([^"]+)"[ \t]*$')
MARKER = re.compile(r"(;*)-+8<-+[ \t]+\[[ \t]*(start|end)[ \t]*:[ \t]*([a-z][-_0-9a-z]*)[ \t]*\]")
TARGET = re.compile(r"^(?P<path>.*?)(?::(?P<section>[a-z][-_0-9a-z]*)|(?P<lines>(?::-?\d*){1,2}))?$")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)")


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def includes(markdown: Path) -> list[str]:
    return [m.group(1) for line in markdown.read_text().splitlines() if (m := INCLUDE.match(line))]


def markdown_files() -> list[Path]:
    """The pages and every markdown file they include (generated tables), transitively."""
    files, queue = [], list(PAGES)
    while queue:
        page = queue.pop()
        if page in files:
            continue
        files.append(page)
        for target in includes(page):
            path = ROOT / TARGET.match(target).group("path")
            if path.suffix == ".md" and path.is_file():
                queue.append(path)
    return files


def test_there_are_pages_and_every_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def entries(nav):
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from entries(value) if isinstance(value, list) else [value]

    nav = set(entries(config["nav"]))
    assert len(PAGES) >= 15
    assert {page.name for page in PAGES} == nav


@pytest.mark.parametrize("page", markdown_files(), ids=lambda path: str(path.relative_to(DOCS)))
def test_every_include_resolves(page):
    for target in includes(page):
        match = TARGET.match(target)
        path = ROOT / match.group("path")
        assert path.is_file(), f"{page.name} includes {target!r}: no file {path.relative_to(ROOT)}"
        lines = path.read_text().splitlines()
        if match.group("section"):
            name = match.group("section")
            markers = [(m.group(2), index) for index, line in enumerate(lines) for m in MARKER.finditer(line)
                       if m.group(3) == name and not m.group(1)]  # fmt: skip
            kinds = [kind for kind, _ in markers]
            assert kinds == ["start", "end"], f"{page.name} includes {target!r}: markers found {markers}"
            assert markers[1][1] - markers[0][1] > 1, f"{page.name} includes {target!r}: the section is empty"
        elif match.group("lines"):
            numbers = [int(n) for n in match.group("lines").strip(":").split(":") if n]
            assert all(1 <= n <= len(lines) for n in numbers), f"{page.name}: {target!r} is past the end of the file"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_every_listing_is_an_include_titled_with_its_file(page):
    """A snippet line the include pattern misses renders as text (a formatter once turned
    `--8<--` into `--8 < --`), and a listing names the file it shows."""
    fence = None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if re.match(r"\s*-+\s*8\s*<\s*-+", line):
            include = INCLUDE.match(line)
            assert include, f"{page.name}:{number}: not a snippet include: {line!r}"
            if fence is not None:
                path = TARGET.match(include.group(1)).group("path")
                assert f'title="{path}"' in fence, f"{page.name}:{number}: the listing of {path} names no file"
        if line.lstrip().startswith("```"):
            fence = line if fence is None else None


@pytest.mark.parametrize("page", markdown_files(), ids=lambda path: str(path.relative_to(DOCS)))
def test_every_image_exists(page):
    for source in IMAGE.findall(page.read_text()):
        assert not source.startswith(("http:", "https:", "//")), f"{page.name}: {source} needs the network"
        assert (DOCS / source).is_file(), f"{page.name} shows {source}, which is not in docs/"


def test_generated_examples_are_current(tmp_path):
    make_examples = load_script("make_examples")
    make_examples.generate(tmp_path, real=False)
    stale = [name for name in make_examples.OFFLINE
             if (tmp_path / name).read_text() != (make_examples.GENERATED / name).read_text()]  # fmt: skip
    assert not stale, (
        f"docs/generated/{stale} differ from what the code makes: run python docs/scripts/make_examples.py"
    )


def test_figures_and_result_tables_are_current(tmp_path, capsys):
    make_figures = load_script("make_figures")
    results = ROOT / "perf" / "results"
    make_figures.run(results, tmp_path / "figures", tmp_path / "tables")
    assert (tmp_path / "figures" / "batching_timeline.png").stat().st_size > 0
    assert (tmp_path / "figures" / "preemption_timeline.png").stat().st_size > 0
    printed = capsys.readouterr().out
    for bench in make_figures.BENCHMARKS:
        made = (tmp_path / "tables" / f"{bench.name}.md").read_text()
        if not (results / f"{bench.name}.json").exists():
            assert f"skipping {bench.name}" in printed and "pending" in made
        committed = DOCS / "generated" / "perf" / f"{bench.name}.md"
        assert committed.read_text() == made, (
            f"{committed.relative_to(ROOT)} does not match perf/results: run python docs/scripts/make_figures.py"
        )


def test_measurement_log_sections_are_dated_in_order_and_cite_files_that_exist():
    log = (ROOT / "perf" / "LOG.md").read_text()
    dates = re.findall(r"^## (\d{4}-\d{2}-\d{2}), ", log, flags=re.MULTILINE)
    assert len(dates) >= 10, "perf/LOG.md: its runs are headed '## YYYY-MM-DD, <commit>: <what>'"
    assert dates == sorted(dates), f"perf/LOG.md: sections out of date order: {dates}"
    cited = set(re.findall(r"perf/results/[\w./-]+\.(?:json|log)", log))
    cited |= {f"perf/results/experiments/{name}" for name in re.findall(r"`(\w+_\d{4}-\d{2}-\d{2}\.json)`", log)}
    missing = sorted(path for path in cited if not (ROOT / path).is_file())
    assert cited and not missing, f"perf/LOG.md cites files that are not there: {missing}"


def test_mkdocs_build_strict(tmp_path):
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")]
    result = subprocess.run(
        command, check=False, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    # Every listing's title links its file (docs/scripts/source_links.py): with no repo_url, a page of the site.
    site = tmp_path / "site"
    for html in site.glob("*/index.html"):
        for title in re.findall(r'<span class="filename">(.*?)</span>', html.read_text()):
            link = re.fullmatch(r'<a href="\.\./(source/[^"]+)">([^<]+)</a>', title)
            assert link, f"{html.relative_to(site)}: the listing title {title!r} links no file"
            assert link.group(1) == f"source/{link.group(2)}/" and (site / link.group(1) / "index.html").is_file()


# The classes docs/api.md documents, and where they are.
API = [("tinyvllm/llm.py", "LLM"), ("tinyvllm/engine/llm_engine.py", "LLMEngine"),
       ("tinyvllm/sampling_params.py", "SamplingParams"), ("tinyvllm/config.py", "EngineConfig"),
       ("tinyvllm/engine/sequence.py", "RequestOutput"),
       ("tinyvllm/engine/sequence.py", "CompletionOutput"), ("tinyvllm/engine/sequence.py", "Logprob")]  # fmt: skip


@pytest.mark.parametrize("path, name", API, ids=[name for _, name in API])
def test_api_reference_documents_every_public_argument(path, name):
    """The API page shows each class's docstring: every field of a dataclass, and every
    argument of `__init__`, is named at the start of a line of its Args or Attributes section."""
    import ast

    tree = ast.parse((ROOT / path).read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    names = [node.target.id for node in cls.body if isinstance(node, ast.AnnAssign)]
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            arguments = node.args
            names += [a.arg for a in arguments.args[1:] + arguments.kwonlyargs]
            names += [f"**{arguments.kwarg.arg}"] if arguments.kwarg else []
    documented = set(re.findall(r"^\s+(\*{0,2}\w+):", ast.get_docstring(cls) or "", flags=re.MULTILINE))
    assert names and not set(names) - documented, f"{name}'s docstring leaves out {set(names) - documented}"
    assert f"::: {path[:-3].replace('/', '.')}.{name}" in (DOCS / "api.md").read_text()


def shown_methods(path: str, name: str) -> list[str] | None:
    """The methods the API page lists for a class: its `members` option, or None for all."""
    text = (DOCS / "api.md").read_text()
    block = text.split(f"::: {path[:-3].replace('/', '.')}.{name}\n", 1)[1].split("\n## ", 1)[0]
    members = re.search(r"members:\s*(false|\[[^\]]*\])", block)
    if members is None:
        return None
    return [] if members.group(1) == "false" else re.findall(r"\w+", members.group(1))


@pytest.mark.parametrize("path, name", API, ids=[name for _, name in API])
def test_api_reference_documents_every_argument_of_the_methods_it_shows(path, name):
    """Each public method the API page shows names every argument in its docstring's Args."""
    import ast

    tree = ast.parse((ROOT / path).read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    shown = shown_methods(path, name)
    methods = [node for node in cls.body if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
               and (shown is None or node.name in shown)]  # fmt: skip
    for method in methods:
        arguments = method.args.args[1:] + method.args.kwonlyargs
        documented = set(re.findall(r"^\s+(\w+):", ast.get_docstring(method) or "", flags=re.MULTILINE))
        missing = {a.arg for a in arguments} - documented
        assert not missing, f"{name}.{method.name}'s docstring leaves out {missing}"


@pytest.mark.parametrize("example", sorted((DOCS / "examples").glob("*.py")), ids=lambda path: path.name)
def test_runnable_example_runs_and_a_page_shows_it(example):
    """docs/examples/ holds the chapters' runnable examples: each runs on a CPU in seconds, its
    assertions hold, and a page includes it as a listing."""
    # one BLAS thread: beside the suite's other workers, two threads each thrash a 2-core machine
    # (three examples at once took 42 s of wall time, one alone 6 s)
    threads = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    environment = {**os.environ, **threads, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(example)]
    result = subprocess.run(command, check=False, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip(), f"{example.name} printed nothing"
    name = str(example.relative_to(ROOT))
    assert any(f'title="{name}"' in page.read_text() for page in PAGES), f"no page shows {name}"
