"""Every relative link and #anchor in README.md and docs/*.md resolves, the site builds with `mkdocs build
--strict`, and no code comment or docstring cites a file the repository does not have.

Anchors are GitHub's heading slugs (lower case, punctuation dropped, a space a hyphen, `-1`, `-2` for repeats),
which is how README.md and docs/ read on GitHub; MkDocs' own check (its toc slugs) runs in the build, so a
heading the two slug differently fails one of them.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, …
# A repository path in a comment: one of its top folders, then a file with an extension (not inside an absolute
# path such as /etc/crewbot/crewbot.env).
CITED_PATH = re.compile(
    r"(?<![\w/.-])((?:core|bot|runner|container|crewbot|tests|bench|scripts|deploy|docs)/[\w./-]*\w\.[A-Za-z]+)\b"
)
CITED_DOC = re.compile(r"(?<![\w/.-])([\w-]+\.md)\b")  # a bare page name (at the root or under docs/)
CODE_FOLDERS = ("core", "bot", "runner", "container", "crewbot", "tests", "bench", "scripts")
# Files whose comments start at `#` (shell, YAML, TOML, make, Dockerfiles, unit files), and what a unit file
# cites outside its comments (Documentation=).
HASH_COMMENTED = ("Makefile", ".ci/run", ".env.example", "mkdocs.yml", "pyproject.toml", ".dockerignore", ".gitignore")
HASH_COMMENTED_GLOBS = ("deploy/**/*", "scripts/*.sh", "runner/runtimes/*.Dockerfile", "tests/**/*.yaml")


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced blocks and code spans, where a link is only an example."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered (no code marks, emphasis or link targets), lower
    case, every character but letters, digits, `_`, `-` and spaces dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for match in HEADING.finditer(FENCE.sub("", text)):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(files: list[Path], root: Path) -> list[str]:
    """One line per link that does not resolve: a missing file (inside `root`) or a missing #anchor."""
    problems: list[str] = []
    for page in files:
        for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
            if EXTERNAL.match(target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: {target}"
            if not resolved.is_relative_to(root) or not resolved.exists():
                problems.append(f"{where}: no such file in the repository")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text(encoding="utf-8")):
                problems.append(f"{where}: {resolved.relative_to(root)} has no heading with that anchor")
    return problems


def comments_and_docstrings(source: str) -> list[str]:
    texts = [
        tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                texts.append(docstring)
    return texts


def missing(text: str, root: Path) -> list[str]:
    cited = [path for path in CITED_PATH.findall(text) if not (root / path).exists()]
    return cited + [
        name for name in CITED_DOC.findall(text) if not any((where / name).exists() for where in (root, root / "docs"))
    ]


def missing_citations(root: Path, folders: tuple[str, ...] = CODE_FOLDERS) -> list[str]:
    """Files that comments and docstrings cite but the repository lacks (a page name may be under docs/)."""
    problems: list[str] = []
    for folder in folders:
        for module in sorted((root / folder).rglob("*.py")):
            source = module.read_text(encoding="utf-8")
            if not missing(source, root):  # most modules: nothing to parse (a test's data may name made-up files)
                continue
            for text in comments_and_docstrings(source):
                problems += [
                    f"{module.relative_to(root)} cites {path}, which is not in the repository"
                    for path in missing(text, root)
                ]
    return problems


def hash_comments(text: str) -> str:
    return "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)


def missing_citations_in_config(root: Path) -> list[str]:
    """The same for the files commented with `#`: what their comments (or a unit's Documentation=) cite."""
    files = [root / name for name in HASH_COMMENTED if (root / name).is_file()]
    files += sorted(path for pattern in HASH_COMMENTED_GLOBS for path in root.glob(pattern) if path.is_file())
    problems: list[str] = []
    for path in files:
        if path.suffix in {".json", ".whl"} or "wheels" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        cited = hash_comments(text) + "\n" + "\n".join(re.findall(r"^Documentation=(.*)$", text, re.MULTILINE))
        problems += [
            f"{path.relative_to(root)} cites {name}, which is not in the repository" for name in missing(cited, root)
        ]
        problems += [
            f"{path.relative_to(root)} cites {uri}, a path an install need not have"
            for uri in re.findall(r"file://(\S+)", cited)
        ]
    return problems


def test_every_link_and_anchor_in_the_docs_resolves() -> None:
    assert broken_links(doc_files(), ROOT) == []


def test_a_broken_anchor_or_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# Top\n\nSee [a](docs/a.md#hello-world-x_y) and [b](docs/b.md).\n")
    (tmp_path / "docs" / "a.md").write_text(
        "# A\n\n## Hello, World: `x_y`\n\n## Again\n\n## Again\n\n"
        "[ok](#again-1) [self](#nope) [up](../README.md#top) [gone](../README.md#bottom) `[code](#x)`\n"
        "```\n[fenced](#y)\n```\n[web](https://example.com/#z)\n"
    )
    problems = broken_links(doc_files(tmp_path), tmp_path)
    assert problems == [
        "README.md: docs/b.md: no such file in the repository",
        "docs/a.md: #nope: docs/a.md has no heading with that anchor",
        "docs/a.md: ../README.md#bottom: README.md has no heading with that anchor",
    ]


def test_github_slugs() -> None:
    assert slug("What MAX_CONCURRENT_SUBAGENTS and the allowances should be on this machine") == (
        "what-max_concurrent_subagents-and-the-allowances-should-be-on-this-machine"
    )
    assert slug("Replies' Markdown to Telegram HTML") == "replies-markdown-to-telegram-html"
    assert slug("`SUBAGENT_CPUS`") == "subagent_cpus"
    assert slug("Subagents: caps and limits") == "subagents-caps-and-limits"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    # strict: a warning fails, and mkdocs.yml asks for warnings on links, anchors and pages left out of the nav.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            "mkdocs.yml",
            "--site-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed (`make docs` shows why):\n{done.stderr[-3000:]}"
    assert (tmp_path / "settings" / "index.html").is_file()


def test_no_comment_cites_a_file_outside_the_repository() -> None:
    assert missing_citations(ROOT) == []
    assert missing_citations_in_config(ROOT) == []


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("Makefile", "# as DESIGN.md says\nall:\n"),
        ("deploy/crewbot.service", "[Unit]\nDocumentation=file:///opt/crewbot/docs/install.md\n"),
        ("deploy/kubernetes/bot.yaml", "kind: Pod  # runner/kube/gone.py makes it\n"),
    ],
)
def test_a_config_files_citation_of_a_missing_file_is_found(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text, encoding="utf-8")
    assert len(missing_citations_in_config(tmp_path)) == 1


@pytest.mark.parametrize("comment", ['# see DESIGN.md "Trust boundary"', "# runner/ipc/gone.py does it"])
def test_a_citation_of_a_missing_file_is_found(tmp_path: Path, comment: str) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "a.py").write_text(f'"""Module."""\n\n{comment}\nX = 1\n')
    assert len(missing_citations(tmp_path, ("core",))) == 1
