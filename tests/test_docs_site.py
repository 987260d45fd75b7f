"""The documentation site builds without a warning, and every link in the README leads somewhere.

- ``mkdocs build --strict`` (the venv's mkdocs, a real process, into a
  temporary ``--site-dir``) succeeds and prints no warning: mkdocs.yml's
  ``validation`` makes a link to a missing page or anchor, and a page left
  out of the nav, a warning, and ``--strict`` an error. A copy of the site
  with one broken link must fail the same build (so the check can fail).
- Every relative link of README.md names a file that exists and, with an
  ``#anchor``, a heading of that file (slugged as the site slugs them).
- Every page of docs/ is in mkdocs.yml's nav, and the nav names no page
  that is not there.
- Every page opens, right under its title, with a paragraph saying what the
  reader will be able to do after reading it.
- In Chromium, the built site leads from its home page to Getting started,
  asks for nothing outside its own files, and a link to another page's
  section lands on it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Set, Tuple

import pytest
import yaml
from markdown.extensions.toc import slugify

from browser import screenshot

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MKDOCS = Path(sys.executable).with_name("mkdocs")
OPENING = "After reading this page you will be able to"

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of one config, as ``make docs`` runs it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([str(MKDOCS), "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)],
                          cwd=config.parent, capture_output=True, text=True, timeout=180, env=env)


def warnings(result: subprocess.CompletedProcess) -> List[str]:
    return [line for line in (result.stdout + result.stderr).splitlines()
            if re.match(r"(WARNING|ERROR)\b", line)]


def prose(text: str) -> Iterator[Tuple[int, str]]:
    """(line number, line) of a Markdown text outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        marker = re.match(r"\s*(```|~~~)", line)
        if marker:
            fence = None if fence == marker.group(1) else (fence or marker.group(1))
            continue
        if fence is None:
            yield number, line


def anchors(path: Path) -> Set[str]:
    """The anchors of a Markdown file's headings, as the site's toc makes them."""
    found = set()
    for _, line in prose(path.read_text(encoding="utf-8")):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            text = re.sub(r"[`*_]", "", heading.group(1))
            found.add(slugify(text, "-"))
    return found


def broken_links(path: Path) -> List[str]:
    """The relative links of a Markdown file that lead nowhere, each with its line."""
    broken = []
    for number, line in prose(path.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue   # http:, https:, mailto: ...
            file, _, anchor = target.partition("#")
            where = (path.parent / file).resolve() if file else path
            if not where.exists():
                broken.append(f"{path.name}:{number}: {target}: no {os.path.relpath(where, path.parent)}")
            elif anchor and where.is_dir():
                broken.append(f"{path.name}:{number}: {target}: an anchor in a directory")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                broken.append(f"{path.name}:{number}: {target}: no heading #{anchor} in {where.name}")
    return broken


def nav_pages(nav) -> List[str]:
    """Every page a nav (mkdocs.yml's ``nav``) names, depth first."""
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def pages() -> List[Path]:
    return sorted(DOCS.glob("**/*.md"))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Tuple[Path, subprocess.CompletedProcess]:
    """The site as ``make docs`` builds it (once for the module), and the build's output."""
    out = tmp_path_factory.mktemp("docs") / "site"
    return out, build(ROOT / "mkdocs.yml", out)


def test_the_site_builds_strict_without_a_warning(site):
    out, result = site
    assert result.returncode == 0, result.stdout + result.stderr
    assert not warnings(result), "\n".join(warnings(result))
    for page in pages():
        name = page.relative_to(DOCS).with_suffix("")
        built = out / name.with_suffix(".html")
        assert built.is_file(), f"{page.name} was not built"


def test_the_getting_started_page_reads_offline_in_a_browser(site, page):
    """In Chromium: the home page leads to Getting started, which asks for nothing but the
    site's own files (no web font: the site is read without a network), and whose links to
    other pages' sections land on them."""
    out, result = site
    assert result.returncode == 0, result.stdout + result.stderr
    requests: List[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto((out / "index.html").as_uri())
    page.get_by_role("link", name="Getting started").first.click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/getting-started.html"), page.url
    assert page.locator("h1").inner_text().rstrip("¶") == "Getting started"
    assert page.locator("article pre").count() >= 5
    link = page.locator("article a", has_text="workq commands").first
    link.click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/protocols.html#workq-commands"), page.url
    assert page.locator("#workq-commands").is_visible()
    screenshot(page, "docs-getting-started-link")
    outside = [url for url in requests if not url.startswith(("file:", "data:", "blob:"))]
    assert not outside, f"the site asked for: {outside}"


@pytest.mark.parametrize("breakage", ["missing-page", "missing-anchor"])
def test_a_broken_link_fails_the_build(tmp_path, breakage):
    """The same build of a copy with one broken link fails, naming it."""
    copy = tmp_path / "copy"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    link = {"missing-page": "[gone](no-such-page.md)",
            "missing-anchor": "[gone](durability.md#no-such-heading)"}[breakage]
    page = copy / "docs" / "protocols.md"
    page.write_text(page.read_text() + f"\nSee {link}.\n")
    result = build(copy / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0, result.stdout + result.stderr
    target = link[link.index("(") + 1:-1]
    assert any(target in line for line in warnings(result)), result.stdout + result.stderr


def test_every_relative_link_in_the_readme_leads_somewhere():
    assert not broken_links(README), "\n".join(broken_links(README))


def test_the_link_check_finds_broken_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Its part\n")
    text = ("[fine](docs/page.md) [fine too](docs/page.md#its-part) [web](https://example.com)\n"
            "```\n[inside code](nowhere.md)\n```\n"
            "[no file](docs/gone.md) [no heading](docs/page.md#another-part)\n")
    readme = tmp_path / "README.md"
    readme.write_text(text)
    broken = broken_links(readme)
    assert [line.split(": ")[1] for line in broken] == ["docs/gone.md", "docs/page.md#another-part"], broken


def test_the_readme_links_to_every_page():
    text = README.read_text(encoding="utf-8")
    missing = [page.name for page in pages() if f"(docs/{page.relative_to(DOCS)}" not in text]
    assert not missing, f"the README does not link to {missing}"


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    there = [str(page.relative_to(DOCS)) for page in pages()]
    assert sorted(set(there) - set(listed)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(listed) - set(there)) == [], "nav entries without a page"
    assert len(listed) == len(set(listed)), "a page is in the nav twice"


@pytest.mark.parametrize("page", pages(), ids=lambda page: page.name)
def test_each_page_opens_with_what_the_reader_will_be_able_to_do(page):
    text = page.read_text(encoding="utf-8")
    title, _, rest = text.partition("\n")
    assert re.match(r"# \S", title), f"{page.name} starts with its title"
    first = rest.strip().split("\n\n")[0]
    assert first.startswith(OPENING), f"{page.name}'s first paragraph: {first[:120]!r}"
    assert len(first.split()) >= 15, f"{page.name}: say what, not only that: {first!r}"
