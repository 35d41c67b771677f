"""What a command leaves on the terminal: TVM's C++ log lines go to a file (cli.native_log), ours stay."""
import json
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from tunekit.models.examples import save_example
from tunekit.testing import run_cli

FAST_TAKE = "Fast mode segfaults"  # topi's take, reached by the transformer's Gather: a real TVM LOG(WARNING)


@pytest.mark.e2e
def test_tvm_native_warnings_go_to_the_run_log_and_debug_prints_them(tmp_path):
    model = save_example("transformer", str(tmp_path / "transformer.onnx"))

    def tune(*debug):
        return run_cli("tune", model, "--cpu-pct", "50", "--trials", "2", "--out", tmp_path / ("d" if debug else "o"),
                       "--json", *debug)

    with ThreadPoolExecutor(2) as pool:  # the two runs side by side: each keeps about one core busy
        quiet, loud = pool.submit(tune), pool.submit(tune, "--debug")
        quiet, loud = quiet.result(), loud.result()
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert json.loads(quiet.stdout)["report_path"]  # stdout still holds only the result
    log = tmp_path / "o" / "tvm-native.log"
    assert FAST_TAKE in log.read_text()
    assert FAST_TAKE not in quiet.stderr, quiet.stderr[-2000:]
    summary = [line for line in quiet.stderr.splitlines() if "TVM's C++ log" in line]
    assert len(summary) == 1 and str(log) in summary[0] and "--debug" in summary[0], quiet.stderr[-2000:]

    assert loud.returncode == 0, loud.stderr[-2000:]
    assert FAST_TAKE in loud.stderr and not (tmp_path / "d" / "tvm-native.log").exists()


@pytest.mark.e2e
def test_a_failed_runs_error_is_stderrs_last_line_after_the_native_log_notice(tmp_path):
    """Scripts read a failure from stderr's last line (benchmarks/zoo.py does): the native log's notice goes
    before the error, never after it."""
    model = save_example("transformer", str(tmp_path / "transformer.onnx"))
    (tmp_path / "gate.yaml").write_text("max_output_error: 1.0e-12\n")  # the untuned build is refused
    proc = run_cli("tune", model, "--cpu-pct", "50", "--trials", "2", "--config", tmp_path / "gate.yaml",
                   "--out", tmp_path / "o")
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert any("TVM's C++ log" in line for line in lines[:-1]), proc.stderr[-2000:]
    assert lines[-1].startswith("tunekit: error:") and "refused" in lines[-1], proc.stderr[-2000:]


def test_the_filter_keeps_tvm_lines_and_their_continuations_and_passes_the_rest(tmp_path):
    """fd 2 of this process and of a child it starts: TVM-shaped lines (and the indented lines that
    continue one) go to the file, every other line reaches stderr, Python's own stderr too."""
    script = textwrap.dedent(r"""
        import os, subprocess, sys
        from tunekit.cli import native_log
        native_log.install()
        os.write(2, b"[12:00:00] /src/a.cc:1: Warning: parent hidden\n  continued hidden\nparent shown\n")
        child = "import os; os.write(2, b'[12:00:01] /src/b.cc:2: Warning: child hidden\\nchild shown\\n')"
        subprocess.run([sys.executable, "-c", child], check=True)
        native_log.write_to(sys.argv[1])  # lines before the file was known are kept too
        os.write(2, b"[12:00:02] /src/c.cc:3: Warning: late hidden\n[not a log line] shown\n")
        print("python's stderr shown", file=sys.stderr)
        native_log.finish()
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for shown in ("parent shown", "child shown", "[not a log line] shown", "python's stderr shown"):
        assert shown in proc.stderr, proc.stderr
    assert "hidden" not in proc.stderr, proc.stderr
    kept = (tmp_path / "tvm-native.log").read_text().splitlines()
    assert [line.split(": ")[-1].strip() for line in kept] == [
        "parent hidden", "continued hidden", "child hidden", "late hidden"]
    assert "4 line(s) of TVM's C++ log" in proc.stderr, proc.stderr


def test_version_names_tunekit_and_the_stack_it_runs_on():
    from importlib import metadata

    ran = run_cli("--version")
    assert ran.returncode == 0, ran.stderr
    line = ran.stdout.strip()
    assert "\n" not in line and line.startswith(f"tunekit {metadata.version('tunekit')} ("), line
    for name in ("apache-tvm", "apache-tvm-ffi", "ray"):
        assert f"{name} {metadata.version(name)}" in line, line
