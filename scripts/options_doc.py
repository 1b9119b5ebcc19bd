"""Write docs/options.md from the options dataclasses (see libreyolo.cli.options_markdown)."""
from __future__ import annotations

from pathlib import Path

from libreyolo.cli import options_markdown

if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "docs" / "options.md"
    path.write_text(options_markdown())
    print(f"wrote {path}")
