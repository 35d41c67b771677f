"""UntunedBuilds (run/untuned_builds.py): an untuned build is copied, not built again, only while its file holds it."""
import os

from tunekit.run.untuned_builds import UntunedBuilds


def test_an_untuned_build_is_reused_only_while_its_file_still_holds_it(tmp_path):
    """A GPU's shares share one untuned build. When another build (the fp32 fallback) is written to the
    file the first was kept at, the next share must build again, not copy the fp32 build as its fp16."""
    builds, made = UntunedBuilds(), []

    def writer(path, text):
        def write():
            made.append(text)
            with open(path, "w") as fh:
                fh.write(text)
        return write

    first, second, third = (str(tmp_path / name) for name in ("untuned-gpu100.so", "untuned-gpu40.so", "x.so"))
    builds.build(first, writer(first, "fp16"), key="fp16 module")
    inode = os.stat(first).st_ino
    builds.build(first, writer(first, "fp16 again"), key="fp16 module")  # built ahead, then asked for at its path
    assert os.stat(first).st_ino == inode and made == ["fp16"]  # neither built again nor copied onto itself
    builds.build(second, writer(second, "fp16 again"), key="fp16 module")
    assert open(second).read() == "fp16" and made == ["fp16"]  # copied, not built again
    builds.build(first, writer(first, "fp32"), key="fp32 module")  # the fallback, over the same file
    builds.build(third, writer(third, "fp16 rebuilt"), key="fp16 module")
    assert open(third).read() == "fp16 rebuilt"
    builds.build(third, writer(third, "tuned"), key=None)  # a build with records, over the kept file
    fourth = str(tmp_path / "y.so")
    builds.build(fourth, writer(fourth, "fp16 built a third time"), key="fp16 module")
    assert open(fourth).read() == "fp16 built a third time"
    assert made == ["fp16", "fp32", "fp16 rebuilt", "tuned", "fp16 built a third time"]
