"""The test command must not fill a newcomer's disk: a passed test's tmp_path (generated datasets,
caches, compiled packages) is removed when it passes; a failed test's stays for inspection. Runs a
two-test session under this repository's pytest configuration in a child process."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_passed_tests_leave_no_temporary_files(tmp_path):
    (tmp_path / "test_probe.py").write_text(
        "def test_passes(tmp_path):\n"
        "    (tmp_path / 'data.bin').write_bytes(b'x' * 1_000_000)\n"
        "def test_fails(tmp_path):\n"
        "    (tmp_path / 'data.bin').write_bytes(b'x' * 1_000_000)\n"
        "    assert False\n")
    base = tmp_path / "base"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
                           "--basetemp", str(base), str(tmp_path / "test_probe.py")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout + proc.stderr
    left = sorted(p.relative_to(base).as_posix() for p in base.rglob("*.bin"))
    assert left == ["test_fails0/data.bin"], left
