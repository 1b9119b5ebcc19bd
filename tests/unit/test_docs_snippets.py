"""The code in the README and docs/ is kept true: every Python block parses, and every
``libreyolo`` command line names a command that exists with options that command accepts, in
values its checks take (the same parser the program uses; nothing is run)."""
from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from libreyolo.cli import COMMANDS, UsageError, _parse

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)


def blocks(lang: str | None = None):
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            if lang is None or m.group(1) == lang:
                yield page, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)


INLINE = re.compile(r"`((?:python -m )?libreyolo(?:\.cli)? [^`]+)`")


def shell_lines():
    """``(page, line, text)`` of every line of the shell code blocks and every inline code span
    that starts with the program (``libreyolo val model=best.pt ...`` in a sentence)."""
    for page, start, lang, body in blocks():
        if lang in ("", "bash", "sh", "shell", "console"):
            for i, line in enumerate(body.replace("\\\n", " ").splitlines()):
                yield page, start + i + 1, line
    for page in PAGES:
        text = page.read_text()
        outside = BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)   # line numbers kept
        for m in INLINE.finditer(outside):
            yield page, outside.count("\n", 0, m.start()) + 1, m.group(1).replace("|\n", "|").replace("\n", " ")


def command_lines():
    """``(page, line, argv after the program name)`` of every libreyolo command in the pages:
    ``libreyolo train ...``, ``python -m libreyolo.cli train ...`` and torchrun's ``-m libreyolo.cli``;
    backslash continuations joined, comments dropped."""
    for page, at, line in shell_lines():
        line = line.split(" #", 1)[0].strip()
        if line.startswith("$ "):
            line = line[2:]
        try:
            argv = shlex.split(line)
        except ValueError:
            continue
        for j, tok in enumerate(argv):
            if tok == "libreyolo" and j == 0 or tok == "libreyolo.cli" and j > 0 and argv[j - 1] == "-m":
                yield page, at, argv[j + 1:]
                break


def test_the_pages_have_code():
    assert sum(1 for _ in blocks("python")) >= 10
    assert sum(1 for _ in command_lines()) >= 10


@pytest.mark.parametrize("page,line,lang,body", list(blocks("python")),
                         ids=lambda v: v.name if isinstance(v, Path) else None)
def test_python_blocks_parse(page, line, lang, body):
    try:
        ast.parse(body)
    except SyntaxError as exc:
        pytest.fail(f"{page.relative_to(ROOT)}:{line + (exc.lineno or 0)}: the python block does not parse: {exc.msg}")


def test_command_lines_use_real_commands_and_options():
    bad = []
    for page, line, argv in command_lines():
        where = f"{page.relative_to(ROOT)}:{line}"
        if not argv or argv[0].startswith(("-", "<")) or argv[0] == "COMMAND":
            continue
        for name in filter(None, argv[0].split("|")):   # `libreyolo predict|track ...`: each
            if name not in COMMANDS:
                bad.append(f"{where}: unknown command {name!r}")
                continue
            spec = COMMANDS[name][1]
            # a placeholder a reader fills in (`imgsz=<s>`, `source=...`) is checked for its key only
            rest, keys = [], []
            for a in argv[1:]:
                if a in ("...", "[...]", "key=value", "KEY=VALUE") or a.startswith("<"):
                    continue
                key, _, value = a.partition("=")
                (keys if value.startswith("<") or value == "..." else rest).append(key)
                if not (value.startswith("<") or value == "..."):
                    rest[-1] = a
            try:
                _parse(rest, spec, name)
                unknown = [k for k in keys if k.lstrip("-").replace("-", "_") not in spec]
                if unknown:
                    bad.append(f"{where}: libreyolo {name}: unknown option(s) {unknown}")
            except UsageError as exc:
                bad.append(f"{where}: libreyolo {name}: {exc}")
    assert not bad, "\n".join(bad)


def test_every_docs_page_is_in_the_site_navigation():
    """mkdocs.yml's nav lists every page of docs/ (mkdocs only mentions one it leaves out)."""
    nav = set(re.findall(r"^\s*- [^:]+: (\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").glob("**/*.md")}
    assert pages - nav == set(), f"docs pages missing from mkdocs.yml's nav: {sorted(pages - nav)}"
    assert nav - pages == set(), f"mkdocs.yml's nav names pages that do not exist: {sorted(nav - pages)}"
