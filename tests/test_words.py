"""The repository speaks to the people who use it: of what they have (a GPU machine without network, an output folder,
a cluster), never of the conditions it was developed under (the machines it borrowed, the calls and tools that
reached them, what those took along, their output variable, the periods of work that used them), in any tracked text
file: book, README, docstrings, comments, configs, file names and messages alike."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKING_CONDITIONS = re.compile(r"\blent\b|device calls?\b|device tool|carry \[|\$OUT\b|\bsessions?\b", re.I)
"""The words of the conditions this repository was developed under."""
PYTEST = re.compile(r"""scope=["']session["']|\bsession fixture|\btest session\b""")
"""pytest's own word for one run of the tests: a fixture's scope, and what it is called where one is used."""


def _tracked_text_files() -> list[Path]:
    """Every file git tracks, or would add (untracked but not ignored), that is text (holds no NUL byte)."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    files = []
    for name in filter(None, names):
        path = REPO / name
        if path.is_file() and path != Path(__file__).resolve() and b"\0" not in path.read_bytes()[:8192]:
            files.append(path)
    return files


def findings(path: Path) -> list[str]:
    """``file:line: text`` for each line of ``path`` (and its name) that holds such a word outside pytest's use."""
    name = str(path.relative_to(REPO))
    found = [f"{name}: the file's name"] if WORKING_CONDITIONS.search(name) else []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if WORKING_CONDITIONS.search(PYTEST.sub("", line)):
            found.append(f"{name}:{number}: {line.strip()[:160]}")
    return found


def test_no_tracked_text_speaks_of_the_working_conditions():
    files = _tracked_text_files()
    assert len(files) > 100 and REPO / "README.md" in files
    found = [f for path in files for f in findings(path)]
    assert not found, "say what a user has instead (a GPU machine without network, an output folder):\n" + \
        "\n".join(found)


def test_the_check_finds_the_words_and_spares_pytest(tmp_path):
    """The check is not blind: it finds each word, case aside, and spares pytest's session fixtures only."""
    for line in ("on a Lent H100", "one device call", "the device tool", 'carry [".gpu/part-1"]', "--out $OUT/x",
                 "a session that", "two sessions", 'scope="session" of another session'):
        assert WORKING_CONDITIONS.search(PYTEST.sub("", line)), line
    for line in ('@pytest.fixture(scope="session")', "# noqa: F401 (session fixture)", "once per test session",
                 "the talent of a lender", "$OUTPUT", "carry the wheels"):
        assert not WORKING_CONDITIONS.search(PYTEST.sub("", line)), line
