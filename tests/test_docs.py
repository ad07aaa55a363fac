"""The docs hold together: every relative link in README.md and docs/*.md names a file or folder of the repo (and a
heading of it, for a link to a section of a page), the README stays short (the topics live in docs/), and the
README's workflow table names every example file and every workflow the worker registers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workflows.catalog import WORKFLOWS

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
README_MAX_BYTES = 12_800  # 12.5 KB
# docs/architecture.md is written on another branch; until it lands its links are allowed to dangle.
PENDING = {REPO / "docs" / "architecture.md"}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(page: Path) -> str:
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links and headings in code blocks are neither


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page)) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def anchors(page: Path) -> set[str]:
    """The section anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.*)$", prose(page), flags=re.M)
    return {
        re.sub(r"[^\w\- ]", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h).strip().lower()).replace(" ", "-")
        for h in headings
    }


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    broken = []
    for target in relative_links(page):
        file, _, section = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if path in PENDING:
            continue
        if not path.exists() or (section and path.suffix == ".md" and section not in anchors(path)):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)} links to what the repo does not have: {broken}"


def test_readme_stays_short():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes (at most {README_MAX_BYTES}): move detail into docs/"


def workflow_table() -> str:
    text = README.read_text()
    start = text.index("| Workflow |")
    return text[start : text.index("\n\n", start)]


def test_readme_table_names_every_example():
    table = workflow_table()
    missing = [p.name for p in sorted((REPO / "examples").iterdir()) if p.is_file() and f"`{p.name}`" not in table]
    assert not missing, f"examples missing from the README's workflow table: {missing}"


def test_readme_table_names_every_workflow():
    table = workflow_table()
    missing = [w.__name__ for w in WORKFLOWS if f"`{w.__name__}`" not in table]
    assert not missing, f"workflows missing from the README's workflow table: {missing}"


def test_docs_index_lists_every_page():
    index = (REPO / "docs" / "index.md").read_text()
    missing = [p.name for p in DOCS if p.name != "index.md" and f"({p.name})" not in index]
    assert not missing, f"docs/index.md does not link {missing}"


OPERATING = REPO / "docs" / "operating.md"


def operating_commands() -> list[list[str]]:
    """Every `millwright ...` command of docs/operating.md, in its code blocks and its inline code."""
    import shlex

    text = OPERATING.read_text()
    blocks = [line for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S) for line in block.splitlines()]
    inline = re.findall(r"`(millwright [^`]+)`", prose(OPERATING))
    lines = [line.strip() for line in [*blocks, *inline] if line.strip().startswith("millwright ")]
    # --install-completion would install it, --version and --help only print: nothing of the command to check.
    return [shlex.split(line)[1:] for line in lines if not re.search(r"--(install-completion|version|help)\b", line)]


@pytest.mark.parametrize("argv", operating_commands(), ids=" ".join)
def test_operating_commands_parse(argv, monkeypatch):
    """Each command the runbooks tell an operator to paste names a command the CLI has, with options it takes and
    every required one (tests/starter/cli/ runs the same commands against the lab)."""
    import typer

    from starter.cli import app

    monkeypatch.delenv("MILLWRIGHT_OPERATOR", raising=False)
    cmd = typer.main.get_command(app)
    ctx = cmd.make_context("millwright", list(argv))
    while hasattr(cmd, "resolve_command"):  # a group: on to its subcommand
        name, sub, rest = cmd.resolve_command(ctx, [*ctx._protected_args, *ctx.args])  # the subcommand, its args
        assert sub is not None, f"no command {name!r}"
        cmd, ctx = sub, sub.make_context(name or "", rest, parent=ctx)
    assert not ctx.args, f"left over: {ctx.args}"


def test_operating_covers_every_control_and_question():
    said = {" ".join(a[:2]) if a[0] in GROUPS else a[0] for a in operating_commands()}
    missing = sorted(EXPECTED - said)
    assert not missing, f"docs/operating.md shows no command for {missing}"


GROUPS = {"rollout", "budget", "breaker", "maintenance", "remediation", "burn-in", "node", "rack"}
EXPECTED = {
    "ls", "status", "rollout pause", "rollout resume", "rollout approve", "rollout retry-node", "rollout skip-node",
    "budget show", "budget set", "breaker show", "breaker reset", "maintenance abort", "remediation approve",
    "burn-in continue", "node why", "node logs", "rack why", "rack remediate", "rack status", "rack approve",
}  # fmt: skip
